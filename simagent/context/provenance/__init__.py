"""Where each number of an answer came from: the provenance engine.

``numbers`` reads numbers as people write them and says when one backs another (shared
with the bench's support scorer); ``engine`` traces an answer's numbers to the session's
sources (pure); ``sources`` reads those sources from a session's trace and raw outputs;
``footnotes`` renders a traced answer. Front ends render the engine's result; none
re-decides a status.
"""
