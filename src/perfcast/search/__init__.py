"""Deployment search: the best deployment of a model under latency objectives
(docs/design/search.md)."""
