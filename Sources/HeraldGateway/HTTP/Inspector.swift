import HeraldCore
import HeraldPorts

/// The inspector (docs/PROTOCOL.md section 18): read-only server routes
/// for the person on call, answering what Herald knows of a user's
/// devices, feed and pushes, and of an app's webhooks and this node.
/// Nothing here answers a push handle, a token or a secret.
extension Gateway {
    /// How many of the feed's last changes the user's inspection shows.
    static let inspectedChanges = 20
    /// How far an endpoint's waiting deliveries are counted: a dead one may hold a day of events.
    static let pendingWebhooksCounted = 10_000

    /// `GET /v1/apps/{app}/users/{user}/inspect`: the devices as the engine
    /// knows them (who is connected is the registry's, on its thread), then
    /// a page of notifications and the last changes from one snapshot on
    /// the reader.
    func inspectUser(_ c: Call, _ user: UserKey) throws(HeraldError) {
        let q = try HistoryQuery(c.req)
        let clock = self.clock, x = c.x
        engine(for: user).perform(on: x.shard, users: [user], { e throws(StoreError) in
            try e.inspectedDevices(user, now: clock.now()).encoded
        }) { [self] r in
            switch r {
            case .failure(let err): x.responder.respond(.error(err))
            case .success(let devices): inspectFeed(x, user, q, devices: devices)
            }
        }
    }

    private func inspectFeed(_ x: Exchange, _ user: UserKey, _ q: HistoryQuery, devices: [UInt8]) {
        let node = bus?.node
        reads.read(on: x.shard, of: user, { (s: StoreReading) throws(StoreError) -> HTTPResponse in
            var body = Array(#"{"node":"#.utf8)
            body.append(contentsOf: node.json.encoded)
            body.append(contentsOf: #","devices":"#.utf8)
            body.append(contentsOf: devices)
            body.append(UInt8(ascii: ","))
            try s.historyPage(user, viewer: .unnamed, filter: q.filter, after: q.before, limit: q.limit).appendFields(to: &body)
            let feed = try s.feed(user)
            let last = try s.changes(user, after: max(feed.floor, feed.head - Int64(Self.inspectedChanges)), limit: Self.inspectedChanges)
            body.append(contentsOf: #","head":\#(feed.head),"changes":"#.utf8)
            ServerFrame.appendArray(last.map(\.encoded), to: &body)
            body.append(UInt8(ascii: "}"))
            return HTTPResponse(status: 200, body: body)
        }) { r in x.responder.respond(Exchange.response(r)) }
    }

    /// `GET /v1/apps/{app}/inspect`: the app's webhook endpoints, gathered
    /// from every partition's dispatcher, this node's live status and, in a
    /// cluster, the app's devices on each node (the presence records, read
    /// on the reader). Bookkeeping (`control`), not a batch: it answers
    /// while the store is down, then without the outbox's counts or nodes.
    func inspectApp(_ c: Call, _ app: AppConfig) {
        let shard = c.x.shard, responder = c.x.responder, partitions = self.partitions
        // Summed by URL: a reload between two partitions' answers may add or drop one.
        var urls: [String] = [], endpoints: [String: (inFlight: Int, pending: Int?, failures: [RecentOutcome])] = [:]
        var waiting = partitions.count
        let gathered = LoopBound({ [self] (part: [EndpointInspection]) in
            for e in part {
                if endpoints[e.url] == nil { urls.append(e.url) }
                let had = endpoints[e.url] ?? (0, 0, [])
                endpoints[e.url] = (had.inFlight + e.inFlight, had.pending.flatMap { p in e.pending.map { p + $0 } }, had.failures + e.failures)
            }
            waiting -= 1
            guard waiting == 0 else { return }
            let hooks: [JSON] = urls.map { url in
                let e = endpoints[url]!
                return ["url": .string(url), "inFlight": .int(e.inFlight), "pending": e.pending.map(JSON.int) ?? .null,
                        "lastFailures": .array(e.failures.sorted { $0.at > $1.at }.prefix(10).map(\.json))]
            }
            var live = JSONObject()
            for (transport, n) in metrics.openConnections() { live[transport] = .int(n) }
            let answer = { [self] (nodes: JSON) in
                responder.respond(.json(200, ["app": .string(app.id), "node": bus.map { .string($0.node) } ?? .null,
                                              "webhooks": .array(hooks), "connections": .object(live), "nodes": nodes,
                                              "health": .object(healthStatus())]))
            }
            guard bus != nil else { return answer(.null) }
            reads.readStoreWide(on: shard, { s throws(StoreError) in
                try (s as? PresenceReading)?.connectedDevices(app: app.id)
            }) { r in answer((try? r.get()).flatMap { $0.map(Self.nodesJSON) } ?? .null) }
        }, owner: shard.thread)
        for engine in partitions {
            engine.control { e in
                let part = e.webhooks.inspection(app: app.id) { url in
                    // Partitions sharing a store count its rows once; a store that is down is not asked.
                    guard e.doesStoreWideWork else { return 0 }
                    guard e.health.isAvailable else { return nil }
                    return try? e.reads.pendingWebhooks(app: app.id, url: url, upTo: Self.pendingWebhooksCounted)
                }
                shard.post { gathered.value(part) }
            }
        }
    }

    /// The presence records' counts by gateway node (a node records its
    /// devices once per partition), every transport shown.
    private static func nodesJSON(_ rows: [(node: String, transport: String, devices: Int)]) -> JSON {
        var nodes: [String] = [], counts: [String: [String: Int]] = [:]
        for row in rows {
            let node = ClusterConnections.gateway(of: row.node)
            if counts[node] == nil { nodes.append(node) }
            counts[node, default: [:]][row.transport, default: 0] += row.devices
        }
        return .array(nodes.map { node in
            var devices = JSONObject()
            for t in TransportKind.allCases { devices[t.rawValue] = .int(counts[node]?[t.rawValue] ?? 0) }
            return ["node": .string(node), "devices": .object(devices)]
        })
    }
}

extension Engine {
    /// The user's devices as the listing shows them (no handle: only its
    /// service), with where each is connected, its pushes in the outbox and
    /// its last push outcomes.
    func inspectedDevices(_ user: UserKey, now: Millis) throws(StoreError) -> JSON {
        let elsewhere = try cluster?.elsewhere(user) ?? [:]
        let pending = try reads.pendingPushes(user)
        return .array(try reads.devices(user).map { d in
            var o = deviceJSON(user, d, elsewhere: elsewhere[d.deviceId], now: now).objectValue!
            o["here"] = registry.connections(user, device: d.deviceId)?.transport(now: now).map { .string($0.rawValue) } ?? .null
            o["elsewhere"] = elsewhere[d.deviceId].map { .string($0.rawValue) } ?? .null
            o["pushesPending"] = .int(pending[d.deviceId] ?? 0)
            o["pushOutcomes"] = .array(push.outcomes.recent(DeviceKey(user: user, device: d.deviceId)).map(\.json))
            return .object(o)
        })
    }
}
