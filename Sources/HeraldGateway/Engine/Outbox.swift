import HeraldCore

/// What the senders of the push and the webhook outboxes share
/// (`PushDispatch`, `WebhookDispatch`; the stores share the rest, `OutboxSQL`).
enum Outbox {
    /// How often an outbox is asked for due rows with nothing else saying
    /// so: another node's lapsed claims, a backlog left at a restart.
    static let pollEvery: Millis = 1_000
    /// How often its length is read for its pending gauge.
    static let pendingEvery: Millis = 5_000

    /// `first` doubling with each attempt to at most `last`, plus up to a
    /// quarter more from `jitter(most)`, so that rows failed together are
    /// not retried together.
    static func backoff(attempts: Int, first: Millis, last: Millis, jitter: (Millis) -> Millis) -> Millis {
        let b = min(last, first << min(attempts, 20))
        return b + jitter(b / 4)
    }

    static func randomJitter(_ most: Millis) -> Millis { Millis.random(in: 0...most) }
}
