"""Scripts that run in child processes of the code sandbox (never imported by exitbench itself).

``codec.py`` is prepended to both scripts: ``server.py`` runs inside the bubblewrap jail with the
model-generated program; ``verifier.py`` runs outside it with the dataset's test and asks the server
for the program's results. Standard library only: the jail's interpreter runs with ``-I -S``.
"""
