"""The version of dmftc (a module of its own: the compiler stamps it into generated modules without importing the
package's __init__, which imports the compiler)."""
__version__ = "0.1.0"
