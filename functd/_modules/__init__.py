"""The module layer: Module, Sequential, Probabilistic and the calling protocol they share.

Modules sit on ``functd._td`` (the container) and ``functd.nn`` (the pure layers);
transforms and optimizers never import them.
"""
