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

/// An in-process bus joining the gateways of one test: a publish reaches
/// every other node's receiver at once. `connected = false` loses what is
/// published meanwhile, as a Redis outage would; `reconnect()` then
/// reports the resubscription.
public final class MemoryBus: Bus {
    public final class Hub: Sendable {
        let nodes = Locked<[MemoryBus]>([])
        public init() {}
    }

    private let hub: Hub
    private let receiver = Locked<BusReceiver?>(nil)
    private let connected = Atomic<Bool>(true)
    /// While paused: what reaches this node, held in order (`pause`).
    private let held = Locked<[@Sendable (BusReceiver) -> Void]?>(nil)
    public let node = Random.hex(8)
    /// How many times the engine handed this bus records (Redis: one
    /// write each), for tests to count its flushes.
    public let recordWrites = Atomic<Int>(0)

    public init(hub: Hub) { self.hub = hub }

    public func start(_ receiver: BusReceiver, metrics: BusMetrics) {
        self.receiver.withLock { $0 = receiver }
        hub.nodes.withLock { $0.append(self) }
        receiver.subscribed()
    }

    public func publish(_ records: [(UserKey, ChangeRecord)]) {
        recordWrites.add(1, ordering: .relaxed)
        toOthers { $0.received(records) }
    }

    public func publish(device deviceId: String, of user: UserKey) { toOthers { $0.deviceChanged(user, deviceId: deviceId) } }

    /// Hands a message to every other connected node, while this one is.
    private func toOthers(_ deliver: @escaping @Sendable (BusReceiver) -> Void) {
        guard connected.load(ordering: .relaxed) else { return }
        for node in hub.nodes.withLock({ $0 }) where node !== self && node.connected.load(ordering: .relaxed) {
            let kept = node.held.withLock { h in h?.append(deliver) != nil }
            if !kept { node.receiver.withLock { $0 }.map(deliver) }
        }
    }

    public func stop() { hub.nodes.withLock { $0.removeAll { $0 === self } } }

    public var state: String { connected.load(ordering: .relaxed) ? "connected" : "disconnected" }

    /// Loses this node's traffic, both ways, until `reconnect()`.
    public func disconnect() { connected.store(false, ordering: .relaxed) }

    /// Holds what reaches this node until `resume()`, as a subscriber that
    /// fell behind would: late, but nothing lost.
    public func pause() { held.withLock { $0 = $0 ?? [] } }

    /// Hands on what was held, in order, before anything published after.
    public func resume() {
        let r = receiver.withLock { $0 }
        held.withLock { h in
            if let r { for deliver in h ?? [] { deliver(r) } }
            h = nil
        }
    }

    public func reconnect() {
        connected.store(true, ordering: .relaxed)
        receiver.withLock { $0 }?.subscribed()
    }
}
