import HeraldCore
import HeraldCrypto
import HeraldPorts
import Synchronization

/// The gateway's wiring: configuration, the partitions' engines, the reads
/// and the shards. The transport creates one shard per service loop and
/// hands each request and WebSocket to the gateway on that shard's thread;
/// each user's writes go to its partition's engine (`engine(for:)`).
public final class Gateway: Sendable {
    public let config: GatewayConfig
    public let metrics = Metrics()
    /// The webhook endpoints' HTTP clients, shared by the partitions.
    let webhookSenders = WebhookSenders()
    public let clock: Clock
    /// The apps in force by id (with the demo app), replaced whole by a
    /// reload; read on every loop.
    private let appsInForce: Locked<[String: AppConfig]>
    /// One engine per partition of the users (`Partition`), each with a
    /// store of its own: the memory store's partitions hold their users'
    /// feeds, and so do SQLite's files (a file has one writer); PostgreSQL's
    /// are connections to one database, where each partition writes its
    /// own users.
    public let partitions: [Engine]
    public let reads: Reads
    let bus: Bus?
    /// A tick (`Clock.ticks`), for the uptime.
    let startedAt: Millis
    let publishBuckets = Locked<[String: TokenBucket]>([:])
    /// Long-polls held now, across shards.
    let heldPolls = Atomic<Int>(0)

    /// Counts one more held poll unless `maxHeldPolls` are held, across
    /// every shard at once (a load then an add let each shard pass the
    /// limit by one).
    func holdPoll() -> Bool {
        var held = heldPolls.load(ordering: .relaxed)
        while held < config.limits.maxHeldPolls {
            let (done, now) = heldPolls.compareExchange(expected: held, desired: held + 1, ordering: .relaxed)
            if done { return true }
            held = now
        }
        return false
    }

    /// `store`'s reader connection (if it has one) serves reads on a thread
    /// of its own. `bus`: the other nodes on the same store.
    /// `push`: the push services' senders (HeraldPush); without it pushes
    /// are recorded but not sent.
    public convenience init(config: GatewayConfig, store: NotificationStore, bus: Bus? = nil, push: PushTransport? = nil,
                            clock: Clock = SystemClock()) throws(StoreError) {
        try self.init(config: config, partitions: [store], bus: bus, push: push, clock: clock)
    }

    /// One partition per store in `partitions`, each writing its own users
    /// (memory stores, SQLite files, or connections to one PostgreSQL
    /// database). Reads run on a reader connection where the store offers
    /// one: each partition's own store, or the first's of a shared store.
    public init(config: GatewayConfig, partitions stores: [NotificationStore], bus: Bus? = nil, push: PushTransport? = nil,
                clock: Clock = SystemClock()) throws(StoreError) {
        precondition(!stores.isEmpty, "a gateway needs a store")
        self.config = config
        self.clock = clock
        self.bus = bus
        appsInForce = Locked(Self.byId(config.allApps))
        startedAt = clock.ticks()
        let readers = try ReaderThread.forEach(of: stores)
        let metrics = self.metrics
        let webhookSenders = self.webhookSenders
        webhookSenders.configure(config.allApps)
        partitions = stores.enumerated().map { i, store in
            Engine(store: store, reader: readers[i], bus: bus, limits: config.limits, metrics: metrics, clock: clock, partition: i,
                   webhookSenders: webhookSenders)
        }
        if bus != nil { metrics.bus.enabled.store(true, ordering: .relaxed) }
        for e in partitions {
            e.partitions = partitions
            e.push.configure(config.allApps)
            e.webhooks.configure(config.allApps)
            e.push.connect(push, partitions: partitions.count)
        }
        push?.share(StoreTokens(engine: partitions[0]))
        reads = Reads(partitions: partitions, readers: readers)
    }

    /// The engine of `user`'s partition: the only one that writes its feed.
    public func engine(for user: UserKey) -> Engine { partitions.owner(of: user) }

    /// Creates the shards, one per service loop, before `start()`.
    public func makeShards(_ executors: [LoopExecutor]) -> [Shard] {
        let shards = executors.enumerated().map { Shard(index: $0.offset, gateway: self, executor: $0.element) }
        for e in partitions { e.shards = shards }
        return shards
    }

    var shards: [Shard] { partitions[0].shards }

    /// Starts the engine and reader threads, and the bus. (In-process tests
    /// drive the engines with `runQueued()` instead, and start the bus
    /// with `startBus()`.)
    public func start() {
        for e in partitions { e.start() }
        reads.start()
        startBus()
    }

    public func startBus() { bus?.start(BusRouter(partitions), metrics: metrics.bus) }

    /// Lets queued commands finish and flushes the stores, then the bus.
    public func stop() {
        // Pushes in flight come back as retries, written before the engines stop.
        partitions[0].push.transport?.stop()
        webhookSenders.stop()
        for e in partitions { e.stop() }
        reads.stop()
        bus?.stop()
    }

    /// Whether every partition's store answers.
    var storeAvailable: Bool { partitions.allSatisfy { $0.health.isAvailable } }

    /// A snapshot of the apps in force.
    var apps: [String: AppConfig] { appsInForce.withLock { $0 } }

    private static func byId(_ apps: [AppConfig]) -> [String: AppConfig] {
        Dictionary(apps.map { ($0.id, $0) }, uniquingKeysWith: { _, last in last })
    }

    /// Puts `apps` (and the demo app, in demo mode) in force: at once for
    /// every request and token checked from now on. Then each shard, on its
    /// own thread, ends the subscriptions whose token no longer verifies
    /// (its secret retired, its app removed); `done` runs once all shards
    /// did, with how many ended. Connections whose tokens still verify are
    /// left alone.
    public func reload(apps: [AppConfig], done: @escaping @Sendable (_ ended: Int) -> Void) {
        var next = config
        next.apps = apps
        let served = Self.byId(next.allApps)
        appsInForce.withLock { $0 = served }
        // The clients first: an endpoint's events are claimed for it once its client is there.
        webhookSenders.configure(next.allApps)
        for e in partitions { e.push.configure(next.allApps); e.webhooks.configure(next.allApps) }
        partitions[0].push.transport?.reload(next.allApps)
        let tally = Locked((shardsLeft: shards.count, ended: 0))
        for shard in shards {
            shard.post {
                let n = shard.endRevoked()
                let total: Int? = tally.withLock { t in
                    t.shardsLeft -= 1
                    t.ended += n
                    return t.shardsLeft == 0 ? t.ended : nil
                }
                if let total { done(total) }
            }
        }
    }

    /// Why `app` cannot take the push handle `reg` registers (SPEC section
    /// 10: a service it has not configured, a Web Push host it does not
    /// allow); nil when it can, or when `reg` names none.
    func pushRefusal(app: String, _ reg: DeviceRegistration?) -> HeraldError? {
        guard case .set(let handle) = reg?.push else { return nil }
        guard let settings = apps[app]?.push else { return .badRequest("push is not configured for this app") }
        return settings.refusal(handle)
    }

    func verify(token: String) -> Result<DeviceToken.Verified, HeraldError> {
        let apps = self.apps
        return DeviceToken.verify(token, now: clock.now()) { apps[$0]?.tokenSecrets }
            .mapError { f in
                switch f { case .invalid(let m): HeraldError(.unauthorized, m) }
            }
    }

    /// Hands the bus's reports to the partitions their users belong to.
    final class BusRouter: BusReceiver {
        let partitions: [Engine]
        init(_ partitions: [Engine]) { self.partitions = partitions }

        func received(_ records: [(UserKey, ChangeRecord)]) {
            guard partitions.count > 1 else { return partitions[0].received(records) }
            let byPartition = Dictionary(grouping: records) { Partition.index(of: $0.0, among: partitions.count) }
            for (i, rs) in byPartition { partitions[i].received(rs) }
        }

        func follows(_ user: UserKey) -> Bool { partitions.owner(of: user).follows(user) }
        func deviceChanged(_ user: UserKey, deviceId: String) { partitions.owner(of: user).deviceChanged(user, deviceId: deviceId) }
        func subscribed() { for e in partitions { e.subscribed() } }
    }

    /// `origin`: the upgrade's `Origin` header, checked at `hello` (`AppConfig.admits`).
    public func openWebSocket(shard: Shard, transport: WebSocketOutput, origin: String? = nil) -> WebSocketSession {
        WebSocketSession(gateway: self, shard: shard, transport: transport, origin: origin)
    }
}

extension Array where Element == Engine {
    /// The engine of `user`'s partition (`Partition`), among all the gateway's.
    func owner(of user: UserKey) -> Engine { self[Partition.index(of: user, among: count)] }
}
