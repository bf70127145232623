"""Monte Carlo paths sharded over JAX devices (the solve option ``devices``).

A solve on several devices places the path axis (the leading axis) of each sample group's standard normals and
weights on ``NamedSharding(Mesh(devices, ('paths',)), P('paths'))``; the jit-compiled marches then run
data-parallel (XLA's SPMD partitioner), and the averages over paths, weighted sums over the path axis, become
cross-device reductions.  Nothing here assumes a kind of device: the devices are ``jax.devices()`` of the
default backend (CPUs, GPUs or TPUs alike).  A group's paths are padded with zero-weight rows to a multiple of
the device count; the same holds for the batches the tangent march and the mean correction cut from them
(:func:`rows_for`, :func:`like_paths`).  One device (the default) leaves every array where it was.
"""
from __future__ import annotations

import contextlib
import numbers

import jax
from threadpoolctl import ThreadpoolController

from dmftc.errors import ParameterError

__all__ = ["check_devices", "path_mesh", "place_paths", "like_paths", "rows_for", "device_count", "describe",
           "serial_blas_on_cpu", "one_blas_thread"]

AXIS = "paths"


def check_devices(v):
    """The option's value, or the error: None, 'all' or an integer >= 1."""
    if v is None or v == "all":
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < 1:
        raise ParameterError(f"devices must be None, 'all' or an integer >= 1 (devices to shard the Monte Carlo "
                             f"paths over), got {v!r}")
    return int(v)


def path_mesh(devices):
    """The one-axis mesh ('paths') over the first ``devices`` devices of the default backend ('all': every one),
    or None for one device (nothing is sharded)."""
    devices = check_devices(devices)
    if devices is None:
        return None
    available = jax.devices()
    n = len(available) if devices == "all" else devices
    if n > len(available):
        raise ParameterError(f"devices={devices}: only {len(available)} {available[0].platform} device(s) are "
                             "visible to JAX (jax.devices()); on one host, XLA_FLAGS="
                             "--xla_force_host_platform_device_count=N set before JAX is imported makes N CPU "
                             "devices")
    if n == 1:
        return None
    from jax.sharding import Mesh

    return Mesh(available[:n], (AXIS,))


def device_count(mesh) -> int:
    return 1 if mesh is None else int(mesh.devices.size)


def rows_for(n: int, mesh) -> int:
    """``n`` rounded up to a multiple of the mesh's device count (paths padded with zero-weight rows)."""
    k = device_count(mesh)
    return -(-int(n) // k) * k


def _sharding(mesh):
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(AXIS))


def place_paths(tree, mesh):
    """Every array of ``tree`` with its leading (path) axis sharded over ``mesh``; unchanged without a mesh."""
    if mesh is None:
        return tree
    sharding = _sharding(mesh)
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), tree)


def like_paths(tree, ref):
    """``tree`` sharded over the paths like the array ``ref`` (a group's weights); unchanged when ``ref`` is not
    sharded over a mesh of several devices (the rows must divide: :func:`rows_for`)."""
    mesh = mesh_of(ref)
    return tree if mesh is None else place_paths(tree, mesh)


def mesh_of(ref):
    """The mesh ``ref`` is sharded over along the paths, or None (one device)."""
    from jax.sharding import NamedSharding

    sharding = getattr(ref, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.devices.size > 1 and AXIS in sharding.mesh.axis_names:
        return sharding.mesh
    return None


def describe(mesh, normals: dict) -> dict:
    """For ``info['devices']``: how many devices, of which platform, and over how many devices the first source's
    normals really are laid out."""
    x = next(iter(normals.values()))
    devs = getattr(getattr(x, "sharding", None), "device_set", None)
    return {"count": device_count(mesh), "platform": mesh.devices.flat[0].platform,
            "normals_sharded_over": len(devs) if devs is not None else 1}


def serial_blas_on_cpu():
    """A context in which NumPy's BLAS runs on one thread when JAX computes on the CPU, else nothing.  A solve
    alternates XLA's marches with BLAS products (kappa, the propagator); a multithreaded BLAS's idle threads keep
    spinning after each product and take the cores from the next march.  Measured on two cores (two_layer,
    T = 250, 10^4 paths in 8 groups, per solve): marches 0.47 -> 0.32 s, kappa 0.16 -> 0.21 s, the whole
    1.0 -> 0.83 s.  On an accelerator the marches leave the CPU to BLAS, which keeps its threads."""
    if jax.default_backend() == "cpu":
        return one_blas_thread()
    return contextlib.nullcontext()


_BLAS: list = []      # the ThreadpoolController of the BLAS libraries NumPy and SciPy loaded (made once: 0.02 ms a
# limit, against 1.2 ms for threadpoolctl.threadpool_limits, which looks the libraries up every time)


def one_blas_thread():
    """A context in which NumPy's and SciPy's BLAS run on one thread."""
    if not _BLAS:
        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=1, user_api="blas")
