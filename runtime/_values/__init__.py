"""Pure values: errors, data types, memory descriptors, op descriptors, post-op chains, keys.

The bottom layer of triodnn. Nothing here imports pyopencl or trio, or any other triodnn layer:
kernels generate from these values, actors key caches on them, the public API re-exports them.
"""
