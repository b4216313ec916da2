"""The transform layer: fd.vmap, fd.grad & co, fd.cuda_graph and named axes.

Transforms see modules only as functions of trees: they import ``functd._td`` and
nothing above it.
"""
