import HeraldCore
import Synchronization

/// The gateway's wiring: configuration, the engine and its shards. The
/// transport creates one shard per service loop and hands each request and
/// WebSocket to the gateway on that shard's thread.
public final class Gateway: @unchecked Sendable {
    public let config: GatewayConfig
    public let metrics = Metrics()
    let apps: [String: AppConfig]
    let engine: Engine
    let startedAt = WallClock.now()
    let publishBuckets = Locked<[String: TokenBucket]>([:])
    /// Long-polls held now, across shards.
    let heldPolls = Atomic<Int>(0)

    public init(config: GatewayConfig, store: NotificationStore) {
        self.config = config
        var apps: [String: AppConfig] = [:]
        for a in config.allApps { apps[a.id] = a }
        self.apps = apps
        engine = Engine(store: store, limits: config.limits, metrics: metrics)
    }

    /// Creates the shards, one per service loop, before `start()`.
    public func makeShards(_ executors: [LoopExecutor]) -> [Shard] {
        engine.shards = executors.enumerated().map { Shard(index: $0.offset, engine: engine, executor: $0.element) }
        return engine.shards
    }

    public func start() { engine.start() }

    /// Lets queued commands finish and flushes the store.
    public func stop() { engine.stop() }

    func verify(token: String) -> Result<DeviceClaims, HeraldError> {
        DeviceToken.verify(token, now: WallClock.now()) { apps[$0]?.tokenSecret }
            .mapError { f in
                switch f { case .invalid(let m): HeraldError(.unauthorized, m) }
            }
    }

    public func openWebSocket(shard: Shard, output: WebSocketOutput) -> WebSocketSession {
        WebSocketSession(gateway: self, shard: shard, output: output, now: WallClock.now())
    }
}
