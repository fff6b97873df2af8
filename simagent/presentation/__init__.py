"""What every front end shows the same way: notice lines, tool-call one-liners and session
transcripts. Above the agent and the session (it reads their events and traces), below the
front ends (headless, the TUI, the bench, the MCP server), so none of them imports another
for display text.
"""
