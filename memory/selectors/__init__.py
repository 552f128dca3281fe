"""Pure reads (HackSoft's "selectors"): every function here only reads, never writes.

Services (memory.services) change state; views, the dashboard and services read through these.
A read that must also keep a session alive (the agent API) calls
memory.services.sessions.session_access, which is this read plus an explicit touch.
"""
