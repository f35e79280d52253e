-- Provider receipts over [from, to) by provider and what folding them did: applied, duplicate,
-- stale (a late `sent` after `delivered`), premature, unmappable (no Herald state), unmatched
-- (no delivery claimed it in time). Unmatched receipts have no tenant: they show for every
-- tenant filter. Distinct provider events (a webhook received three times counts once).
SELECT
    provider,
    outcome,
    uniqExact(provider_event_id) AS receipts
FROM receipt_events FINAL
WHERE received_at >= {from:DateTime64(3)} AND received_at < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id IN ({tenant:String}, ''))
GROUP BY provider, outcome
ORDER BY provider, outcome
