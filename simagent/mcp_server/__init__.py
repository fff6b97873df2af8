"""``simagent mcp``: simagent's kernel layer as an MCP server for any agent host.

``ops`` (pure rules), ``service`` (the tools on a Session, no SDK), ``server`` (FastMCP,
stdio and streamable HTTP). A front end: it sits beside ``headless`` and the TUI.
"""
