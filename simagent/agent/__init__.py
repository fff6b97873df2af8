"""The agent layer: the deepagents graph around the kernel, its tools and the turn runner.

Heavy imports (deepagents, langchain) happen in the submodules, never here.
"""
