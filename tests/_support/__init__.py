"""What the tests share and nothing collects: case registries, worker scripts, data.

See tests/README.md for what lives where.
"""
