"""The request handlers of `oncelog serve`, one module per API or family of APIs.

Each handler takes the broker and a decoded request and returns the response body
(or None for acks=0, or a Frame it built itself); `oncelog.server.api_registry`
maps each API key to its handler.
"""
