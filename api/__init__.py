"""Herald's HTTP intake API (FastAPI): see api/README.md.

app.py             create_app(settings) / create_app_from_env() (uvicorn factory)
fastpath.py        POST /v1/notifications at the ASGI layer (hot path)
routes/            one router per resource (notifications, preferences, devices, callbacks,
                   inbox, tracking, otp, segments, unsubscribe)
kafka.py           asyncio producer: futures resolved by delivery reports (202 after the ack)
redis_pipeline.py  pipelining Redis client for the hot-path Lua scripts
status.py          delivery status read from the hot state the jobs write (the Redis key
                   layout and the inbox store shared with the jobs are herald/keys.py and
                   herald/inbox.py)
models.py          request bodies and their mapping onto the Avro contracts
"""
