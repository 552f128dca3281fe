"""Framework adapters over ctxapp's REST client (ctxapp/client/), each an optional extra:
`pip install 'ctxapp[langchain]'` (langchain.py), `'ctxapp[langgraph]'` (langgraph.py)."""
