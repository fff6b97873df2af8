"""Sessions as Jupyter notebooks, both ways (design.md §10 "Notebooks").

Out: ``plan`` chooses, from a session's trace and execution records, what a notebook of
it holds (pure); ``export`` builds and writes it with ``nbformat``; ``rerun`` executes
one with ``nbclient`` in a fresh kernel and checks that the session's reported values
come out the same. In: ``load`` reads a notebook a session starts from
(``--from-notebook``).
"""
