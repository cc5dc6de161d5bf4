import HeraldCore
import Synchronization

/// Carries committed changes between the gateway nodes of one store (SPEC
/// section 9): Redis pub/sub in production (`HeraldRedis`), `MemoryBus` in
/// the in-process tests, as centrifuge has memory and Redis brokers.
public protocol Bus: AnyObject, Sendable {
    /// Starts connecting; from now on `receiver` gets other nodes' records
    /// and each (re)subscription. `metrics`: the `herald_bus_*` it keeps.
    func start(_ receiver: BusReceiver, metrics: BusMetrics)
    /// Publishes a batch's records after its commit, from the engine
    /// thread, in commit order. Never blocks: the bus queues them.
    func publish(_ records: [(UserKey, ChangeRecord)])
    /// Says, after its commit, that `deviceId` of `user` was deleted or
    /// took another platform or tags: nodes with connections of it look it
    /// up again (SPEC 4: a deleted device's connections close with 4003).
    func publish(device deviceId: String, of user: UserKey)
    /// Sends what is queued (briefly) and stops.
    func stop()
    /// For `/healthz`: `connected`, `connecting` or `disconnected`.
    var state: String { get }
    /// This node's id, new for each process: on its records, and its
    /// devices' presence (`ClusterConnections`).
    var node: String { get }
}

/// What a bus reports to; called on the bus's own threads.
public protocol BusReceiver: AnyObject, Sendable {
    /// Records committed on other nodes, in the order the bus delivered them.
    func received(_ records: [(UserKey, ChangeRecord)])
    /// Another node deleted or re-registered `deviceId` of `user`.
    func deviceChanged(_ user: UserKey, deviceId: String)
    /// Subscribed (again): whatever was published meanwhile was missed.
    func subscribed()
    /// Whether `user` has followers here, so its records are worth
    /// decoding; any thread.
    func follows(_ user: UserKey) -> Bool
}

/// A record as it travels on a bus: a JSON header (node, user, the change's
/// presences, time) and, after a newline, the change exactly as the
/// committing node encoded it, so no node encodes a change again.
/// A device event is the header alone, with `device` and no change.
public enum BusWire {
    public enum Message {
        case record(ChangeRecord)
        case device(String)
        /// A record `decode` was not asked for: its change left undecoded.
        case unwanted
    }

    public static func encode(node: String, user: UserKey, _ r: ChangeRecord) -> [UInt8] {
        let header: JSON = ["node": .string(node), "app": .string(user.app), "user": .string(user.user),
                            "at": .int(r.at), "before": r.before?.json ?? .null, "after": r.after?.json ?? .null]
        return header.encoded + [0x0A] + r.encoded
    }

    public static func encode(node: String, user: UserKey, device: String) -> [UInt8] {
        let header: JSON = ["node": .string(node), "app": .string(user.app), "user": .string(user.user), "device": .string(device)]
        return header.encoded + [0x0A]
    }

    /// nil for bytes that are neither (logged and dropped by the bus). A
    /// record's change, the costly part (it holds the app's payload), is
    /// decoded only when `wanted(node, user)`.
    public static func decode(_ bytes: UnsafeBufferPointer<UInt8>, wanted: (String, UserKey) -> Bool = { _, _ in true })
        -> (node: String, user: UserKey, message: Message)? {
        guard let nl = bytes.firstIndex(of: 0x0A),
              let h = (try? JSONParser.parse(UnsafeBufferPointer(rebasing: bytes[..<nl])))?.objectValue,
              let node = h["node"]?.stringValue, let app = h["app"]?.stringValue, let user = h["user"]?.stringValue
        else { return nil }
        let key = UserKey(app: app, user: user)
        if let device = h["device"]?.stringValue { return (node, key, .device(device)) }
        guard let at = h["at"]?.int64Value else { return nil }
        guard wanted(node, key) else { return (node, key, .unwanted) }
        let body = UnsafeBufferPointer(rebasing: bytes[(nl + 1)...])
        // A change nests the app's payload two levels down.
        guard let change = (try? JSONParser.parse(body, maxDepth: JSONParser.defaultMaxDepth + 8)).flatMap(Change.init(json:))
        else { return nil }
        let before = h["before"].flatMap(Presence.init(json:)), after = h["after"].flatMap(Presence.init(json:))
        return (node, key, .record(ChangeRecord(change: change, before: before, after: after, at: at, encoded: Array(body))))
    }
}

/// `herald_bus_*`: the bus connection and what crossed it.
public final class BusMetrics: Sendable {
    /// Set by the gateway when it runs with a bus: `/metrics` then shows these.
    public let enabled = Atomic<Bool>(false)
    /// 1 while subscribed, else 0.
    public let connected = Atomic<Int>(0)
    /// Subscriptions after the first: each one catches every follower up.
    public let resubscriptions = Atomic<Int>(0)
    public let published = Atomic<Int>(0)
    public let received = Atomic<Int>(0)
    /// Records waiting to be published (held while Redis is away).
    public let queued = Atomic<Int>(0)
    /// Records never published: the queue was full while Redis was away.
    public let dropped = Atomic<Int>(0)
    /// Users whose followers were caught up from the store: a seq past the
    /// next one expected (a record missed or reordered on the bus).
    public let catchUps = Atomic<Int>(0)
    /// Users whose feed head stayed past what reached this node (`FeedAudit`):
    /// a change committed that never came over the bus.
    public let missed = Atomic<Int>(0)

    public init() {}
}
