"""Messages about a sweep, sent to people: `message.py` (what an event says, in each channel's
form), `channels.py` (a webhook, e-mail: the only code that sends), `outbox.py` (each event once:
the ledger of what was sent, retries with back-off). Which events happen is decided by the
sweep's supervisor (supervise/notices.py)."""
