import HeraldCore

/// A push on its way to a service: the outbox row, and the handle read
/// from the registration in the transaction that claimed it.
public struct OutgoingPush: Sendable {
    public let job: PushJob
    public let handle: PushHandle
    /// The app's settings when it was claimed.
    public let settings: PushSettings

    public init(job: PushJob, handle: PushHandle, settings: PushSettings) {
        self.job = job; self.handle = handle; self.settings = settings
    }
}

/// What a push service answered (SPEC section 10, "Outcomes").
public enum PushOutcome: Sendable, Equatable {
    /// 2xx.
    case delivered
    /// The handle is dead (APNs 410, BadDeviceToken; FCM UNREGISTERED, SENDER_ID_MISMATCH; Web Push 404/410).
    /// `reason`: the service's reason code (or HTTP status), from a bounded
    /// set: a metric's label and what `PushHealth` judges.
    case unregistered(String, reason: String)
    /// 429, 5xx, Web Push 406, a timeout or a network error: again later, no sooner than `retryAfterSeconds`.
    case retry(String, retryAfterSeconds: Int?)
    /// The app's credentials were refused (APNs 403, FCM 401 and other 403s): kept and retried.
    case credentialsRefused(String)
    /// Any other refusal of this push (a 4xx that names no handle): dropped.
    /// `reason` as for `unregistered`.
    case rejected(String, reason: String)
}

/// The push services, behind one call (HeraldPush implements it). `send`
/// never blocks: it hands the push to the sender's own threads, and
/// `completion` runs on one of them, once.
public protocol PushTransport: AnyObject, Sendable {
    /// Pushes it takes unanswered at once: the outbox hands it no more, and
    /// keeps the rest in the store.
    var capacity: Int { get }
    func send(_ push: OutgoingPush, completion: @escaping @Sendable (PushOutcome) -> Void)
    /// Where the senders keep what every process and node of the
    /// deployment shares; given by the gateway once, before any `send`.
    func share(_ tokens: SharedTokens)
    /// Reads every app's credentials again (SIGHUP); an app whose files do
    /// not read keeps the ones it had.
    func reload(_ apps: [AppConfig])
    /// Ends every request in flight (each completes with a retry) and the threads.
    func stop()
}

/// Tokens the push senders share with every process and node of the
/// deployment (SPEC section 10: Apple asks for few APNs provider tokens per
/// team, and refuses one renewed within 20 minutes), kept in the store.
public protocol SharedTokens: Sendable {
    /// The token kept under `name` if it was made less than `renewAfter`
    /// ago; else one `make(now)` signs, kept in its place, unless another
    /// process renewed it first (then that one). `completion` runs once,
    /// on the engine's thread (`Engine.exchange`): nil when the store could
    /// not be reached or the gateway is stopping.
    func token(_ name: String, renewAfter: Millis, make: @escaping @Sendable (Millis) -> String,
               completion: @escaping @Sendable (SharedToken?) -> Void)
}
