"""``simagent acp``: simagent as an Agent Client Protocol agent over stdio, for editors
(Zed, JetBrains, Neovim) and JupyterLab's chat (jupyter-ai 3). A front end: it drives the
same session, graph, context layers, trace and approval as the TUI and ``simagent run``."""
