import HeraldCore
import HeraldPorts
import Synchronization

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
