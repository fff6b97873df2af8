"""simagent in JupyterLab's chat: a jupyter-ai 3 persona (the ``jupyter`` extra) that runs
``simagent acp`` and hands it the kernel of the notebook beside the chat."""
