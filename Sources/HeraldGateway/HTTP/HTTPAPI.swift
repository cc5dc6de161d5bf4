import Foundation
import HeraldCore
import HeraldCrypto
import HeraldPorts

/// The HTTP API of SPEC sections 2-4 and 6. Parsing, routing and
/// authentication run on the shard's loop; writes run on the engine and
/// reads on the reader, whose answers come back to the loop to be written.
/// No code here touches the store.
extension Gateway {
    public static let upgradeExpected = HeraldError(.badRequest, "GET /v1/ws expects a WebSocket upgrade")

    /// A request on its route: the path's `{name}` values, and its hops.
    struct Call {
        let req: HTTPRequest
        let values: [String]
        let x: Exchange
        /// The path's last value: the `{id}` or `{deviceId}` it names.
        var id: String { values[values.count - 1] }
    }

    /// Matches `req` (`Route.match`), answers a preflight or refuses an
    /// origin (`crossOrigin`), checks the credential the route takes, then
    /// calls its handler with what that credential proved.
    public func handle(_ req: HTTPRequest, shard: Shard, responder: HTTPResponder) {
        shard.thread.preconditionCurrent()
        switch Route.match(method: req.method, path: req.path, demo: config.demo) {
        case .failure(let e):
            // No route proves an app, so every origin is admitted.
            let responder = crossOrigin(req, nil, responder).0
            if let methods = e.allowedMethods, let answer = preflight(req, methods: methods) { return responder.respond(answer) }
            responder.respond(.error(e))
        case .success(let m):
            let (responder, admitted) = crossOrigin(req, m, responder)
            guard admitted else { return responder.respond(.error(Self.originRefused)) }
            let c = Call(req: req, values: m.values, x: Exchange(gateway: self, shard: shard, responder: responder))
            do throws(HeraldError) {
                // `Path` checks that a server route's path has its `{app}` (and `{user}`).
                switch m.route.handler {
                case .open(let h): try h(self, c)
                case .app(let h): try h(self, c, try serverAuth(req, m.serverApp!))
                case .user(let h): try h(self, c, try serverUser(req, m.serverApp!, m.serverUser!))
                case .device(let inQuery, let namesDevice, let h):
                    try h(self, c, try deviceAuth(req, tokenInQuery: inQuery, namesDevice: namesDevice))
                }
            } catch {
                responder.respond(.error(error))
            }
        }
    }

    // MARK: Handlers (the routes of `Route.Path.all`)

    func health(_ c: Call) {
        // 200 while the process serves: a store outage is every node's
        // (they share it), so a load balancer gains nothing by draining.
        c.x.responder.respond(.json(200, .object(healthStatus())))
    }

    /// `/healthz`'s answer, also the inspector's (docs/PROTOCOL.md sections 14 and 18).
    func healthStatus() -> JSONObject {
        var health = JSONObject()
        health["status"] = "ok"
        health["uptimeSeconds"] = .int((clock.ticks() - startedAt) / 1000)
        health["store"] = .string(storeAvailable ? "ok" : "unavailable")
        health["bus"] = bus.map { .string($0.state) }
        if partitions[0].push.settings.withLock({ !$0.isEmpty }) {
            health["push"] = .string(metrics.push.health.isFailing ? "failing" : "ok")
            let problems = metrics.push.health.problems
            if !problems.isEmpty { health["pushProblems"] = .array(problems) }
        }
        return health
    }

    func metricsText(_ c: Call) {
        let own = metrics.prometheusText()
        let text = config.workerMetrics.map { $0.text(own: own) } ?? own
        c.x.responder.respond(HTTPResponse(status: 200, contentType: "text/plain; version=0.0.4", body: Array(text.utf8)))
    }

    func demoToken(_ c: Call) throws(HeraldError) {
        let t = try TokenRequest(bytes: c.req.body)
        // A configured app named `demo` is the demo app (allApps keeps it).
        let demo = apps[config.demoApp.id] ?? config.demoApp
        c.x.responder.respond(.json(200, issueToken(demo, t, extra: ["appId": .string(demo.id)])))
    }

    func issueToken(_ c: Call, _ app: AppConfig) throws(HeraldError) {
        c.x.responder.respond(.json(200, issueToken(app, try TokenRequest(bytes: c.req.body))))
    }

    func bulkSend(_ c: Call, _ app: AppConfig) throws(HeraldError) {
        let send = try BulkSend(bytes: c.req.body)
        // By tags, the users are known only once the send runs.
        var named: [UserKey]? = nil
        if case .users(let ids) = send.audience { named = ids.map { UserKey(app: app.id, user: $0) } }
        try admitPublishes(app.id, max(named?.count ?? 0, 1))
        c.x.sendAppWide(app.id, send, to: named)
    }

    func publish(_ c: Call, _ user: UserKey) throws(HeraldError) {
        var f = try Fields(bytes: c.req.body)
        let draft = try NotificationDraft(reading: &f)
        try f.finish()
        try admitPublishes(user.app, 1)
        let clock = self.clock
        c.x.write(user, [.appNotificationId(user, draft.appNotificationId)]) { e throws(StoreError) in
            try e.upsertNotification(user, draft, now: clock.now()).map { published in
                switch published {
                case .saved(let answer, let created): HTTPResponse(status: created ? 201 : 200, body: answer.httpBody)
                case .suppressed: .json(200, ["notification": .null, "seq": .null, "suppressed": "preferences"])
                }
            }
        }
    }

    /// `GET .../preferences` (SPEC section 12), of a device's user or by its app's server.
    func preferences(_ c: Call, _ user: UserKey) {
        let critical = apps[user.app]?.criticalGroups ?? []
        c.x.read(user, nil) { s, _ throws(StoreError) in
            .success(.json(200, ["preferences": try s.preferences(user).with(critical: critical).json]))
        }
    }

    /// `PUT .../preferences` (SPEC section 12).
    func savePreferences(_ c: Call, _ user: UserKey, by actor: ChangeActor) throws(HeraldError) {
        let update = try PreferencesUpdate(bytes: c.req.body, ifMatch: c.req.headers["if-match"])
        let clock = self.clock
        c.x.write(user) { e throws(StoreError) in
            try e.savePreferences(user, update, by: actor, now: clock.now()).map { p, seq in
                .json(200, ["preferences": p.json, "seq": .int(seq)])
            }
        }
    }

    /// `device`: the device the request names (a device's own view), nil for a server's.
    func history(_ c: Call, _ user: UserKey, _ device: String?) throws(HeraldError) {
        let q = try HistoryQuery(c.req)
        c.x.read(user, device) { s, v throws(StoreError) in
            var body = Array("{".utf8)
            try s.historyPage(user, viewer: v, filter: q.filter, after: q.before, limit: q.limit).appendFields(to: &body)
            body.append(UInt8(ascii: "}"))
            return .success(HTTPResponse(status: 200, body: body))
        }
    }

    /// The `{id}` of a notification route; an id of no form the gateway
    /// gives is unknown, and goes no further.
    private func notificationId(_ c: Call) throws(HeraldError) -> String {
        guard NotificationID.isWellFormed(c.id) else { throw .notFound }
        return c.id
    }

    func getNotification(_ c: Call, _ user: UserKey, _ device: String?) throws(HeraldError) {
        let id = try notificationId(c)
        c.x.read(user, device) { s, v throws(StoreError) in
            guard let n = try s.visibleNotification(user, id: id, viewer: v) else { return .failure(.notFound) }
            var body = Array(#"{"notification":"#.utf8)
            n.encode(into: &body)
            body.append(UInt8(ascii: "}"))
            return .success(HTTPResponse(status: 200, body: body))
        }
    }

    func updateNotification(_ c: Call, _ user: UserKey, _ device: String?) throws(HeraldError) {
        let id = try notificationId(c)
        let u = try StateUpdate(bytes: c.req.body, ifMatch: c.req.headers["if-match"])
        let clock = self.clock
        c.x.write(user, [.id(user, id)]) { e throws(StoreError) in
            let now = clock.now()
            return try e.withViewer(user, deviceId: device, now: now) { v throws(StoreError) in
                try e.updateState(user, id: id, u, viewer: v, by: device.map(ChangeActor.device) ?? .app, now: now).map { HTTPResponse(status: 200, body: $0.httpBody) }
            }
        }
    }

    func deleteNotification(_ c: Call, _ user: UserKey, _ device: String?) throws(HeraldError) {
        let id = try notificationId(c)
        let clock = self.clock
        c.x.write(user, [.id(user, id)]) { e throws(StoreError) in
            let now = clock.now()
            return try e.withViewer(user, deviceId: device, now: now) { v throws(StoreError) in
                try e.deleteNotification(user, id: id, viewer: v, by: device.map(ChangeActor.device) ?? .app, now: now).map { _ in .noContent }
            }
        }
    }

    func listDevices(_ c: Call, _ user: UserKey) {
        let clock = self.clock
        c.x.write(user) { e throws(StoreError) in .success(.json(200, ["devices": try e.deviceListing(user, now: clock.now())])) }
    }

    func readAll(_ c: Call, _ d: DeviceContext) {
        markAll(c, d) { e, user, v, now throws(StoreError) in try e.markAllRead(user, viewer: v, now: now) }
    }

    func seenAll(_ c: Call, _ d: DeviceContext) {
        markAll(c, d) { e, user, v, now throws(StoreError) in try e.markAllSeen(user, viewer: v, now: now) }
    }

    /// `read-all` and `seen-all`: `mark` over what the device may see.
    private func markAll(_ c: Call, _ d: DeviceContext,
                         _ mark: @escaping @Sendable (Engine, UserKey, Viewer, Millis) throws(StoreError) -> (updated: Int, seq: Int64)) {
        let clock = self.clock
        c.x.write(d.user) { e throws(StoreError) in
            let now = clock.now()
            return try e.withViewer(d.user, deviceId: d.deviceId, now: now) { v throws(StoreError) in
                let (n, seq) = try mark(e, d.user, v, now)
                return .success(.json(200, ["updated": .int(n), "seq": .int(seq)]))
            }
        }
    }

    func counts(_ c: Call, _ d: DeviceContext) {
        c.x.read(d.user, d.deviceId) { s, v throws(StoreError) in
            let n = try s.visibleCounts(d.user, viewer: v)
            return .success(.json(200, ["unread": .int(n.unread), "unseen": .int(n.unseen), "noInteraction": .int(n.noInteraction),
                                        "total": .int(n.total)]))
        }
    }

    func pushServices(_ c: Call, _ d: DeviceContext) {
        let settings = apps[d.user.app]?.push
        c.x.responder.respond(.json(200, ["services": .array((settings?.services ?? []).map { .string($0.rawValue) }),
                                          "webPushPublicKey": settings?.webPush.map { .string($0.publicKey) } ?? .null]))
    }

    /// The `{deviceId}` of a device route, of a device or its app's server.
    private func deviceId(_ c: Call) throws(HeraldError) -> String {
        guard Identifiers.isUserId(c.id) else { throw HeraldError.badRequest("bad device id") }
        return c.id
    }

    /// The `{deviceId}` a device acts on: its own, if its token is bound to one.
    private func deviceId(_ c: Call, of d: DeviceContext) throws(HeraldError) -> String {
        let id = try deviceId(c)
        if let bound = d.claims.device, bound != id { throw HeraldError(.forbidden, "the token is bound to another device") }
        return id
    }

    func registerDevice(_ c: Call, _ d: DeviceContext) throws(HeraldError) { try registerDevice(c, d.user, deviceId(c, of: d)) }
    func registerDevice(_ c: Call, _ user: UserKey) throws(HeraldError) { try registerDevice(c, user, deviceId(c)) }
    func deleteDevice(_ c: Call, _ d: DeviceContext) throws(HeraldError) { deleteDevice(c, d.user, try deviceId(c, of: d)) }
    func deleteDevice(_ c: Call, _ user: UserKey) throws(HeraldError) { deleteDevice(c, user, try deviceId(c)) }

    private func registerDevice(_ c: Call, _ user: UserKey, _ id: String) throws(HeraldError) {
        let reg = try DeviceRegistration(bytes: c.req.body)
        if let refusal = pushRefusal(app: user.app, reg) { throw refusal }
        let clock = self.clock
        c.x.write(user, NotificationLookup.registering(reg, for: user)) { e throws(StoreError) in
            try e.registerDevice(user, deviceId: id, reg, now: clock.now()).map { .json(200, ["device": $0]) }
        }
    }

    private func deleteDevice(_ c: Call, _ user: UserKey, _ id: String) {
        c.x.write(user) { e throws(StoreError) in
            try e.deleteDevice(user, deviceId: id) ? .success(.noContent) : .failure(HeraldError(.notFound, "no such device"))
        }
    }

    /// One request's hops: a write on the engine, or a read on the reader
    /// as the device's viewer; either way the answer comes back to the loop.
    struct Exchange {
        let gateway: Gateway
        let shard: Shard
        let responder: HTTPResponder

        /// `body` writes `user`'s data, on its partition's engine;
        /// `lookups`: the notifications it reads.
        func write(_ user: UserKey, _ lookups: [NotificationLookup] = [],
                   _ body: @escaping @Sendable (Engine) throws(StoreError) -> Result<HTTPResponse, HeraldError>) {
            gateway.engine(for: user).perform(on: shard, users: [user], lookups: lookups, body) { [responder] r in
                responder.respond(Self.response(r.flatMap { $0 }))
            }
        }

        /// An app-wide send (SPEC section 3): each partition writes its share
        /// of `named` (by tags, nil: the users it finds) in one batch; `202`
        /// with the users reached once every partition committed, or the
        /// first error once all answered.
        func sendAppWide(_ app: String, _ send: BulkSend, to named: [UserKey]?) {
            let partitions = gateway.partitions, clock = gateway.clock, responder = self.responder
            let shares: [(Engine, [UserKey]?)] = named.map { users in
                Partition.split(users, among: partitions.count).map { (partitions[$0.key], $0.value) }
            } ?? partitions.map { ($0, nil) }
            var waiting = shares.count, reached = 0
            var failure: HeraldError?
            for (engine, users) in shares {
                let lookups = (users ?? []).map { NotificationLookup.appNotificationId($0, send.draft.appNotificationId) }
                engine.perform(on: shard, users: users, lookups: lookups, { e throws(StoreError) in
                    try e.bulkSend(app: app, send, to: users, now: clock.now())
                }) { r in
                    switch r.flatMap({ $0 }) {
                    case .success(let n): reached += n
                    case .failure(let err): failure = failure ?? err
                    }
                    waiting -= 1
                    guard waiting == 0 else { return }
                    responder.respond(failure.map(HTTPResponse.error) ?? .json(202, ["users": .int(reached)]))
                }
            }
        }

        /// Resolves the viewer (a named device unknown so far is registered,
        /// on the engine), then runs `body` on one store snapshot.
        func read(_ user: UserKey, _ deviceId: String?,
                  _ body: @escaping @Sendable (StoreReading, Viewer) throws(StoreError) -> Result<HTTPResponse, HeraldError>) {
            let g = gateway, shard = self.shard, responder = self.responder
            g.viewer(user, deviceId: deviceId, on: shard) { v in
                switch v {
                case .failure(let err): responder.respond(.error(err))
                case .success(let viewer):
                    g.reads.read(on: shard, of: user, { s throws(StoreError) in try body(s, viewer) }) { r in
                        responder.respond(Self.response(r.flatMap { $0 }))
                    }
                }
            }
        }

        static func response(_ r: Result<HTTPResponse, HeraldError>) -> HTTPResponse {
            switch r {
            case .success(let ok): ok
            case .failure(let err): .error(err)
            }
        }
    }

    /// The viewer of `deviceId` for a read: a registered device is read
    /// beside the engine (which only notes it was seen); an unknown one is
    /// registered on the engine first.
    func viewer(_ user: UserKey, deviceId: String?, on shard: Shard, _ then: @escaping (Result<Viewer, HeraldError>) -> Void) {
        guard let deviceId else { return then(.success(.unnamed)) }
        let now = clock.now()
        let engine = engine(for: user)
        reads.read(on: shard, of: user, { s throws(StoreError) in try s.device(user, id: deviceId) }) { r in
            switch r {
            case .failure(let err): then(.failure(err))
            case .success(let device?):
                engine.control { e in e.registry.seen(user, device: deviceId, at: now) }
                then(.success(Viewer(userId: user.user, device: device)))
            case .success(nil):
                engine.perform(on: shard, users: [user], { e throws(StoreError) in try e.registerViewer(user, deviceId: deviceId, now: now) }) {
                    then($0.flatMap { $0 })
                }
            }
        }
    }

    // MARK: Authentication

    func serverAuth(_ req: HTTPRequest, _ appId: String) throws(HeraldError) -> AppConfig {
        guard let key = bearer(req) else { throw HeraldError(.unauthorized, "missing server key") }
        let presented = Array(key.utf8)
        // An unknown app answers like a wrong key, so app ids do not leak.
        guard let app = apps[appId], app.serverKeys.contains(where: { constantTimeEquals(presented, Array($0.utf8)) }) else {
            throw HeraldError(.unauthorized, "wrong server key for this app")
        }
        return app
    }

    /// The per-app publish rate (`publishesPerSecondPerApp`, burst twice that).
    func admitPublishes(_ appId: String, _ n: Int) throws(HeraldError) {
        let rate = Double(config.limits.publishesPerSecondPerApp)
        let now = clock.ticks()
        let r = publishBuckets.withLock { b in
            b[appId, default: TokenBucket(rate: rate, burst: 2 * rate, now: now)].take(Double(n), now: now)
        }
        if case .failure(let wait) = r {
            throw HeraldError(.rateLimited, "more than \(Int(rate)) publishes per second for this app", retryAfterSeconds: wait.seconds)
        }
    }

    func serverUser(_ req: HTTPRequest, _ appId: String, _ userId: String) throws(HeraldError) -> UserKey {
        let app = try serverAuth(req, appId)
        guard Identifiers.isUserId(userId) else { throw HeraldError.badRequest("bad user id") }
        return UserKey(app: app.id, user: userId)
    }

    func bearer(_ req: HTTPRequest) -> String? {
        // As bytes: a String's split walks Characters (8,000 instructions a request).
        guard let h = req.headers["authorization"]?.utf8, let space = h.firstIndex(of: UInt8(ascii: " ")),
              HTTPWire.equalsIgnoringCase(h[..<space], "bearer".utf8)
        else { return nil }
        let t = Substring(h[h.index(after: space)...]).trimmingSpaces
        return t.isEmpty ? nil : String(t)
    }

    struct DeviceContext: Sendable {
        let claims: DeviceClaims
        let signature: TokenSignature
        let user: UserKey
        /// The device the client named, or its token is bound to; nil for an unnamed client.
        let deviceId: String?
    }

    func deviceToken(_ req: HTTPRequest, inQuery: Bool) -> String? {
        bearer(req) ?? (inQuery ? req.queryValue("token") : nil)
    }

    func deviceAuth(_ req: HTTPRequest, tokenInQuery: Bool = false, namesDevice: Bool = true) throws(HeraldError) -> DeviceContext {
        guard let token = deviceToken(req, inQuery: tokenInQuery) else { throw HeraldError(.unauthorized, "missing device token") }
        let verified = try verify(token: token).get()
        let claims = verified.claims
        var device: String? = nil
        if namesDevice {
            let header = req.headers["herald-device"].map { String(Substring($0).trimmingSpaces) }
            let query = req.queryValue("deviceId")
            if let header, let query, header != query {
                throw HeraldError.badRequest("Herald-Device and ?deviceId= name different devices")
            }
            if let named = header ?? query {
                guard Identifiers.isUserId(named) else { throw HeraldError.badRequest("bad device id") }
                if let bound = claims.device, bound != named {
                    throw HeraldError(.forbidden, "the token is bound to another device")
                }
                device = named
            } else {
                device = claims.device
            }
        }
        return DeviceContext(claims: claims, signature: verified.signature, user: claims.userKey, deviceId: device)
    }

    func issueToken(_ app: AppConfig, _ t: TokenRequest, extra: JSONObject = [:]) -> JSON {
        let now = clock.now() / 1000
        let c = DeviceClaims(app: app.id, user: t.userId, device: t.deviceId, issuedAt: now, expiresAt: now + t.ttlSeconds)
        let s = app.signingSecret
        var o: JSONObject = ["token": .string(DeviceToken.sign(c, secret: s.secret, kid: s.kid)),
                             "expiresAt": .string(RFC3339.format(c.expiresAt * 1000))]
        for (k, v) in extra.pairs { o[k] = v }
        return .object(o)
    }

    // MARK: Demo page

    func staticFile(_ name: String) throws(HeraldError) -> HTTPResponse { try file(name, in: config.webRoot) }

    /// A file of the inspector's page. Its policy lets it run only its own
    /// scripts and styles, talk only to this origin, and be framed by no
    /// page: it holds a server key (docs/SECURITY.md).
    func adminFile(_ name: String) throws(HeraldError) -> HTTPResponse {
        guard Route.isFileName(Substring(name)) else { throw Route.notFound }
        var r = try file(name, in: config.adminRoot)
        r.headers += Self.adminHeaders
        return r
    }

    static let adminHeaders = [
        ("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
            + "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
        ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
    ]

    private func file(_ name: String, in root: String?) throws(HeraldError) -> HTTPResponse {
        guard let root, let data = FileManager.default.contents(atPath: root + "/" + name) else { throw Route.notFound }
        let type: String
        switch name.split(separator: ".").last {
        case "html": type = "text/html; charset=utf-8"
        case "js": type = "text/javascript; charset=utf-8"
        case "css": type = "text/css; charset=utf-8"
        case "png": type = "image/png"
        case "svg": type = "image/svg+xml"
        default: type = "application/octet-stream"
        }
        return HTTPResponse(status: 200, contentType: type, headers: [("Cache-Control", "no-cache")], body: Array(data))
    }
}

/// The query of a history page (SPEC section 4).
struct HistoryQuery: Sendable {
    var limit = 50
    var before: HistoryKey?
    var filter = HistoryFilter()

    init(_ req: HTTPRequest) throws(HeraldError) {
        if let l = req.queryValue("limit") {
            guard let v = Int(l), (1...500).contains(v) else { throw HeraldError.badRequest("limit must be 1 to 500") }
            limit = v
        }
        if let b = req.queryValue("before") {
            guard let k = PageToken.decode(b) else { throw HeraldError.badRequest("before is not a page token") }
            before = k
        }
        filter.readState = try Self.state(req, "readState")
        filter.seenState = try Self.state(req, "seenState")
        filter.userActionState = try Self.state(req, "userActionState")
    }

    /// The state filter `name`, if given; a value that is no state is 400.
    private static func state<S: RawRepresentable & CaseIterable>(_ req: HTTPRequest, _ name: String) throws(HeraldError) -> S?
        where S.RawValue == String
    {
        guard let text = req.queryValue(name) else { return nil }
        guard let v = S(rawValue: text) else {
            throw HeraldError.badRequest("\(name) must be one of \(S.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return v
    }
}
