"""The dispatch sink's parts: settings, event loop, clients, shaping, the batch engine.

    settings.py   DispatchSettings (HERALD_DISPATCH_*)
    loop.py       LoopThread: the provider clients' asyncio loop, one per sink partition
    clients.py    Providers: provider name -> client (sinks/providers, inbox.py), built lazily
    inbox.py      InboxClient: the in-app channel (the API's Redis inbox + WebSocket push)
    contacts.py   ContactStore: preference re-check, null addresses, device-token cleanup
    sending.py    ShapedSender: rate tokens per (provider, tenant), concurrent sends
    work.py       Item (one delivery in a batch), Outputs (what a batch produces)
    engine.py     Dispatcher: guard → re-checks → breaker → shaping → send → decide → effects
    records.py    RecordEncoder: Outputs → Kafka records (events, retries, dead letters)

sinks/dispatch.py wires them into the Bytewax sink.
"""
