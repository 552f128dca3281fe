"""Framework adapters over ctxapp's REST client (ctxapp/client.py), each an optional extra:
`pip install 'ctxapp[langchain]'` (langchain.py), `'ctxapp[langgraph]'` (langgraph.py)."""
