"""The dispatch engine: deliveries in, provider calls out, their outcomes to Kafka.

sink.py       DispatchSink: the Bytewax sink that wires the parts below (one partition per
              worker) and produces each batch's outcomes before it returns
settings.py   DispatchSettings (HERALD_DISPATCH_*)
loop.py       LoopThread: the provider clients' asyncio loop, one per sink partition
clients.py    Providers: provider name -> client (sinks/providers, inbox.py), built lazily
inbox.py      InboxClient: the in-app channel (the API's Redis inbox + WebSocket push)
contacts.py   ContactStore: preference re-check, null addresses, device-token cleanup
sending.py    ShapedSender: rate tokens per (provider, tenant), concurrent sends
work.py       Item (one delivery in a batch), Outputs (what a batch produces)
engine.py     Dispatcher: guard → re-checks → breaker → shaping → send → decide → effects
records.py    RecordEncoder: Outputs → Kafka records (events, retries, dead letters)
fallback.py   a cross-channel fallback: when to fall back, and its I/O
escalation.py an escalating type's held message: sent only when the first went unread
reconcile.py  UNKNOWN outcomes: ask the provider, then sent, send again, or wait
simenv.py     the environment pointing the provider clients at the simulators
"""
