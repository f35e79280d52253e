"""Herald's HTTP intake API (FastAPI): see api/README.md.

app.py        create_app(settings) / create_app_from_env() (uvicorn factory)
fastpath.py   POST /v1/notifications at the ASGI layer (hot path)
routes/       one router per resource (notifications, preferences, devices, callbacks,
              inbox, tracking, otp)
kafka.py      asyncio producer: futures resolved by delivery reports (202 after the ack)
resp.py       pipelining Redis client for the hot-path Lua scripts
keys.py       Redis key layout; status.py, inbox.py: hot state read/written by jobs too
models.py     request bodies and their mapping onto the Avro contracts
"""
