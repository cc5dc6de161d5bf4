import HeraldCore
import Synchronization

/// The gateway's wiring: configuration, the engine, the reads and the
/// shards. The transport creates one shard per service loop and hands each
/// request and WebSocket to the gateway on that shard's thread.
public final class Gateway: Sendable {
    public let config: GatewayConfig
    public let metrics = Metrics()
    public let clock: Clock
    let apps: [String: AppConfig]
    public let engine: Engine
    public let reads: Reads
    let startedAt: Millis
    let publishBuckets = Locked<[String: TokenBucket]>([:])
    /// Long-polls held now, across shards.
    let heldPolls = Atomic<Int>(0)

    /// `store`'s reader connection (if it has one) serves reads on a thread of its own.
    public init(config: GatewayConfig, store: NotificationStore, clock: Clock = SystemClock()) throws(StoreError) {
        self.config = config
        self.clock = clock
        var apps: [String: AppConfig] = [:]
        for a in config.allApps { apps[a.id] = a }
        self.apps = apps
        startedAt = clock.now()
        engine = Engine(store: store, limits: config.limits, metrics: metrics, clock: clock)
        reads = Reads(engine: engine, reader: try store.makeReader())
    }

    /// Creates the shards, one per service loop, before `start()`.
    public func makeShards(_ executors: [LoopExecutor]) -> [Shard] {
        engine.shards = executors.enumerated().map { Shard(index: $0.offset, gateway: self, executor: $0.element) }
        return engine.shards
    }

    /// Starts the engine and reader threads. (In-process tests drive the
    /// engine with `engine.runQueued()` instead.)
    public func start() {
        engine.start()
        reads.start()
    }

    /// Lets queued commands finish and flushes the store.
    public func stop() {
        engine.stop()
        reads.stop()
    }

    func verify(token: String) -> Result<DeviceClaims, HeraldError> {
        DeviceToken.verify(token, now: clock.now()) { apps[$0]?.tokenSecrets }
            .map(\.claims)
            .mapError { f in
                switch f { case .invalid(let m): HeraldError(.unauthorized, m) }
            }
    }

    public func openWebSocket(shard: Shard, transport: WebSocketOutput) -> WebSocketSession {
        WebSocketSession(gateway: self, shard: shard, transport: transport)
    }
}
