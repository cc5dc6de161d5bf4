import HeraldCore
import HeraldPorts

/// Both ends of the webhook outbox (SPEC section 13), on the engine thread:
/// the push outbox's mechanism (`PushDispatch`, the store's claim under a
/// lease), for events.
///
/// **Recording.** Each write of the batch notes the events it gives
/// (`note`, from `FeedTransaction`); `record`, before the commit, writes one
/// outbox row per event and endpoint that takes its type, in the batch's
/// transaction. An acknowledged change is never left without its events
/// by a crash (at least once; exactly once while nothing fails).
///
/// **Sending.** Each endpoint has room for `WebhookSenders.claimedPerEndpoint`
/// claimed deliveries per partition (`perEndpoint` of them on the wire). Rows are claimed as they are recorded,
/// where there is room (the common case), as answers make room (in the
/// answers' batch), or else by `run` (each engine loop turn, when
/// something may be due), in a transaction of its own;
/// PostgreSQL skips rows another node claims, so one node sends each. Once
/// the claim is durable the requests go to the endpoint's own client
/// (`WebhookSenders`), and each answer comes back as a write in a later
/// batch (`finished`). Nothing on the engine waits for a receiver, and
/// memory holds only what is in flight, whatever the outbox's length.
final class WebhookDispatch {
    /// Apps' endpoints by app id, swapped whole by a reload.
    let endpoints = Locked<[String: [WebhookEndpoint]]>([:])
    let metrics: WebhookMetrics
    let senders: WebhookSenders
    private let clock: Clock
    private let thread: ThreadOwner
    /// The engine whose batches write the receivers' answers.
    weak var engine: Engine?

    /// Longer than a claimed delivery may wait for the wire (30 s), its
    /// request (15 s) and its answer's write.
    static let claimLease: Millis = 60_000
    static let sweepEvery: Millis = 60_000
    static let firstRetry: Millis = 5_000
    static let lastRetry: Millis = 3_600_000
    /// How long an event is tried for, from its commit.
    static let lifetime: Millis = 86_400_000

    private struct EndpointKey: Hashable { let app: String; let url: String }

    // Engine thread only.
    private var events: [(app: String, event: WebhookEvent)] = []
    private var inFlight: [EndpointKey: Int] = [:]
    /// Endpoints that may have due rows left unclaimed (a claim filled
    /// their room, or found none): an answer from one claims again at once.
    private var backlog: Set<EndpointKey> = []
    /// Endpoints in `backlog` that answers of this batch made room for: claimed for in the batch (`record`).
    private var answered: Set<EndpointKey> = []
    /// Endpoints whose last answer failed: logged once when they start and stop failing.
    private var failing: Set<EndpointKey> = []
    private var wake = true
    private var nextPoll: Millis = 0
    private var nextPending: Millis = 0
    private var nextSweep: Millis = 0
    /// The earliest time a delivery this node retried falls due.
    private var nextRetry: Millis?
    /// This partition's outbox length, as last added to `herald_webhook_pending`.
    private var countedPending = 0
    /// Each endpoint's last failed deliveries, for the inspector: the why
    /// stays in the log (a receiver's answer may quote anything).
    private var failures = RecentOutcomes<EndpointKey>(perKey: 10, keys: 1_000)

    init(metrics: WebhookMetrics, senders: WebhookSenders, clock: Clock, thread: ThreadOwner) {
        self.metrics = metrics; self.senders = senders; self.clock = clock; self.thread = thread
    }

    func configure(_ apps: [AppConfig]) {
        let hooked = apps.filter { !$0.webhooks.isEmpty }.map { ($0.id, $0.webhooks) }
        endpoints.withLock { $0 = Dictionary(hooked, uniquingKeysWith: { _, last in last }) }
        if !hooked.isEmpty { metrics.enabled.store(true, ordering: .relaxed) }
    }

    // MARK: Recording (inside the batch's transaction)

    /// A change of `user` committing in this batch (`FeedTransaction`):
    /// its events, when the app has endpoints.
    func note(_ user: UserKey, _ record: ChangeRecord, previous: Notification?, published: Bool, by actor: ChangeActor) {
        guard let list = endpoints.withLock({ $0[user.app] }) else { return }
        // Only the types some endpoint takes are built.
        let types = WebhookEvent.types(record.change, previous: previous, published: published, by: actor)
            .filter { t in list.contains { $0.takes(t) } }
        for e in WebhookEvent.events(user, record.change, at: record.at, types: types, by: actor) { events.append((user.app, e)) }
    }

    /// An event that is no change of a feed (`push.unregistered`, from
    /// `FeedTransaction.removeHandle`).
    func note(_ app: String, _ event: WebhookEvent) {
        guard endpoints.withLock({ $0[app] != nil }) else { return }
        events.append((app, event))
    }

    func rolledBack() {
        events.removeAll()
        // What the answers made room for is claimed at the next turn instead.
        if !answered.isEmpty { wake = true }
        answered.removeAll()
    }

    /// Records the batch's events, before its commit, and claims for the
    /// endpoints they and the batch's answers are for.
    func record(_ tx: FeedTransaction) throws(StoreError) {
        guard !events.isEmpty || !answered.isEmpty else { return }
        defer { events.removeAll(keepingCapacity: true); answered.removeAll() }
        let all = endpoints.withLock { $0 }
        let now = clock.now()
        var written: [String: [WebhookEndpoint]] = [:]
        // An endpoint a reload removed has nothing to claim.
        for key in answered {
            if let endpoint = all[key.app]?.first(where: { $0.url == key.url }) { written[key.app, default: []].append(endpoint) }
        }
        for (app, e) in events {
            let takers = (all[app] ?? []).filter { $0.takes(e.type) }
            guard !takers.isEmpty else { continue }
            // One id per event, the same for every endpoint and retry.
            let id = "msg_" + Random.hex(12), body = e.body
            for endpoint in takers {
                try tx.webhookOutbox.enqueueWebhook(app: app, url: endpoint.url, eventId: id, body: body, at: now)
                if !(written[app]?.contains(endpoint) ?? false) { written[app, default: []].append(endpoint) }
            }
        }
        // Claimed in the change's own transaction where there is room (the
        // common case: no second transaction before they go), or the answers'.
        if try claim(tx, written, now: now) { tx.afterCommit { [self] in wake = true } }
    }

    /// Claims, for each of `endpoints`, what it has room for, to send once
    /// `tx` is durable; whether some endpoint's claim filled its room (more may be due).
    private func claim(_ tx: FeedTransaction, _ endpoints: [String: [WebhookEndpoint]], now: Millis) throws(StoreError) -> Bool {
        guard let engine else { return false }
        var full = false
        for (app, list) in endpoints {
            for endpoint in list {
                let key = EndpointKey(app: app, url: endpoint.url)
                let room = WebhookSenders.claimedPerEndpoint - inFlight[key, default: 0]
                // A full endpoint is claimed for again as its answers come (`finished`).
                guard room > 0 else {
                    backlog.insert(key)
                    continue
                }
                let jobs = try tx.webhookOutbox.claimWebhooks(app: app, url: endpoint.url, now: now, until: now + Self.claimLease, limit: room)
                if jobs.count == room {
                    full = true
                    backlog.insert(key)
                } else {
                    backlog.remove(key)
                }
                guard !jobs.isEmpty else { continue }
                inFlight[key, default: 0] += jobs.count
                tx.onRollback { [self] in inFlight[key, default: 0] -= jobs.count }
                tx.afterCommit { [self] in for j in jobs { send(engine, endpoint, key, j) } }
            }
        }
        return full
    }

    // MARK: Sending

    /// Claims due deliveries for each endpoint with room and sends them,
    /// when something may be due. `storeWide`: this partition also sweeps
    /// and counts its store's outbox (`Engine.doesStoreWideWork`).
    func run(_ transactions: Transactions, now: Millis, tick: Millis, storeWide: Bool) {
        thread.preconditionCurrent()
        let retryDue = nextRetry.map { now >= $0 } ?? false
        let sweep = storeWide && tick >= nextSweep, countPending = storeWide && tick >= nextPending
        guard wake || retryDue || tick >= nextPoll || sweep || countPending else { return }
        wake = false
        nextPoll = tick + Outbox.pollEvery
        if retryDue { nextRetry = nil }
        if sweep { nextSweep = tick + Self.sweepEvery }
        if countPending { nextPending = tick + Outbox.pendingEvery }
        let all = endpoints.withLock { $0 }
        var full = false
        transactions.run("webhook claim") { tx throws(StoreError) in
            if sweep {
                // Past their 24 hours, or for an endpoint the config no longer names.
                let dropped = try tx.webhookOutbox.dropWebhooks(committedBefore: now - Self.lifetime, limit: 10_000)
                if dropped > 0 {
                    metrics.count(.expired, dropped)
                    Log.warning("webhook: dropped \(dropped) event(s) undelivered for 24 hours")
                }
            }
            full = try claim(tx, all, now: now)
            if countPending {
                // The gauge sums the partitions' outboxes: each adds how its own moved.
                let pending = try tx.reads.pendingWebhooks()
                metrics.pending.add(pending - countedPending, ordering: .relaxed)
                countedPending = pending
            }
        }
        // A full claim may have left more due.
        if full { wake = true }
    }

    private func send(_ engine: Engine, _ endpoint: WebhookEndpoint, _ key: EndpointKey, _ job: WebhookJob) {
        senders.send(job, to: endpoint, now: clock.now()) { outcome in
            engine.write(users: [], taken: { e in e.webhooks.inFlight[key, default: 0] -= 1 }) { e throws(StoreError) in
                try e.webhooks.finished(e.tx, job, key, outcome, now: e.clock.now())
            }
        }
    }

    /// What a receiver's answer does to the outbox.
    private func finished(_ tx: FeedTransaction, _ job: WebhookJob, _ key: EndpointKey, _ outcome: WebhookOutcome,
                          now: Millis) throws(StoreError) {
        thread.preconditionCurrent()
        // Room for the endpoint's next, if any wait: claimed for before this batch commits.
        if backlog.contains(key) { answered.insert(key) }
        switch outcome {
        case .delivered:
            try tx.webhookOutbox.finishWebhook(job)
            metrics.count(.delivered)
            metrics.latency.observe(nanos: UInt64(max(0, now - job.committedAt)) * 1_000_000)
            if failing.remove(key) != nil { Log.info("webhook: \(key.url) of app \(key.app) accepts events again") }
        case .failed(let why, let after):
            failures.note(key, .init(at: now, outcome: "failed", reason: nil))
            if failing.insert(key).inserted {
                Log.warning("webhook: \(key.url) of app \(key.app) failed (\(why)); its events are kept and retried for 24 hours")
            }
            let at = now + Self.delay(attempts: job.attempts, retryAfterSeconds: after, jitter: Outbox.randomJitter)
            guard at <= job.committedAt + Self.lifetime else {
                try tx.webhookOutbox.finishWebhook(job)
                return metrics.count(.expired)
            }
            try tx.webhookOutbox.retryWebhook(job, at: at, attempted: true)
            metrics.count(.retried)
            nextRetry = min(nextRetry ?? at, at)
        case .notSent:
            // Due again at once; claimed again as room comes.
            try tx.webhookOutbox.retryWebhook(job, at: now, attempted: false)
            wake = true
        }
    }

    /// The inspector's view of `app`'s endpoints on this partition: URLs
    /// (never their secrets), requests in flight, the deliveries `pending`
    /// counts for a URL, and last failures.
    func inspection(app: String, pending: (String) -> Int?) -> [EndpointInspection] {
        thread.preconditionCurrent()
        return (endpoints.withLock { $0[app] } ?? []).map { e in
            let key = EndpointKey(app: app, url: e.url)
            return EndpointInspection(url: e.url, inFlight: inFlight[key] ?? 0, pending: pending(e.url), failures: failures.recent(key))
        }
    }

    /// How long until the next attempt after `attempts` failed ones: 5 s
    /// doubling, with jitter (`Outbox.backoff`); no sooner than the
    /// receiver's `Retry-After`; never more than 1 h.
    static func delay(attempts: Int, retryAfterSeconds: Int?, jitter: (Millis) -> Millis) -> Millis {
        let asked = Millis(min(max(0, retryAfterSeconds ?? 0), Int(lastRetry / 1_000))) * 1_000
        return min(lastRetry, max(Outbox.backoff(attempts: attempts, first: firstRetry, last: lastRetry, jitter: jitter), asked))
    }
}

/// A webhook endpoint as one partition sees it (`WebhookDispatch.inspection`).
struct EndpointInspection: Sendable {
    let url: String
    let inFlight: Int
    /// Its deliveries in the outbox; nil when the store did not answer.
    let pending: Int?
    let failures: [RecentOutcome]
}
