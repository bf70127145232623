"""Stage 1-2: the syntax tree, the Lark parser with located errors, and the semantic checks (two-layer and
deep specs; deep actions lowered to their saddle-point equations)."""
