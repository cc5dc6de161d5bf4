import Foundation
import HeraldCore

/// The HTTP API of SPEC sections 2-4 and 6. Parsing, routing and
/// authentication run on the shard thread; store work runs on the engine,
/// whose answer comes back to the shard to be written.
extension Gateway {
    public static let upgradeExpected = HeraldError(.badRequest, "GET /v1/ws expects a WebSocket upgrade")

    public func handle(_ req: HTTPRequest, shard: Shard, responder: HTTPResponder) {
        let reply: (HTTPResponse) -> Void = { responder.respond($0) }
        let route: Route
        switch Route.match(method: req.method, path: req.path, demo: config.demo) {
        case .failure(let e): return reply(.error(e))
        case .success(let r): route = r
        }
        let exec = Exec(engine: engine, shard: shard, responder: responder)
        do throws(HeraldError) {
            switch route {
            case .health:
                reply(.json(200, ["status": "ok", "uptimeSeconds": .int((WallClock.now() - startedAt) / 1000)]))
            case .metrics:
                reply(HTTPResponse(status: 200, contentType: "text/plain; version=0.0.4", body: Array(metrics.prometheusText().utf8)))
            case .webSocket:
                throw Self.upgradeExpected
            case .staticFile(let name):
                reply(try staticFile(name))
            case .demoToken:
                let t = try TokenRequest(bytes: req.body)
                reply(.json(200, issueToken(config.demoApp, t, extra: ["appId": .string(config.demoApp.id)])))
            case .tokens(let appId):
                let app = try serverAuth(req, appId)
                reply(.json(200, issueToken(app, try TokenRequest(bytes: req.body))))
            case .bulkSend(let appId):
                let app = try serverAuth(req, appId)
                let send = try BulkSend(bytes: req.body)
                if case .users(let ids) = send.audience { try admitPublishes(app.id, ids.count) } else { try admitPublishes(app.id, 1) }
                try bulkSend(app, send, exec)
            case .userNotifications(let appId, let userId):
                let user = try serverUser(req, appId, userId)
                if req.method == "POST" {
                    var f = try Fields(bytes: req.body)
                    let draft = try NotificationDraft(reading: &f)
                    try f.finish()
                    try admitPublishes(user.app, 1)
                    exec.run { e in
                        switch try e.publish(user, draft, now: WallClock.now()) {
                        case .failure(let err): return .error(err)
                        case .success(let (n, seq, created)):
                            return .json(created ? 201 : 200, ["notification": n.json, "seq": .int(seq)])
                        }
                    }
                } else {
                    try history(req, user, deviceId: nil, exec)
                }
            case .userNotification(let appId, let userId, let id):
                try notificationRoute(req, try serverUser(req, appId, userId), deviceId: nil, id: id, exec)
            case .userDevices(let appId, let userId):
                let user = try serverUser(req, appId, userId)
                exec.run { e in
                    let now = WallClock.now()
                    return .json(200, ["devices": .array(try e.store.devices(user).map { e.deviceJSON(user, $0, now: now) })])
                }
            case .myNotifications:
                let d = try deviceAuth(req)
                try history(req, d.user, deviceId: d.deviceId, exec)
            case .myNotification(let id):
                let d = try deviceAuth(req)
                try notificationRoute(req, d.user, deviceId: d.deviceId, id: id, exec)
            case .myReadAll:
                let d = try deviceAuth(req)
                exec.run { e in
                    let now = WallClock.now()
                    let v = try e.viewer(d.user, deviceId: d.deviceId, now: now)
                    let (n, seq) = try e.readAll(d.user, viewer: v, now: now)
                    return .json(200, ["updated": .int(n), "seq": .int(seq)])
                }
            case .myCounts:
                let d = try deviceAuth(req)
                exec.run { e in
                    let v = try e.viewer(d.user, deviceId: d.deviceId, now: WallClock.now())
                    let c = try e.counts(d.user, viewer: v)
                    return .json(200, ["unread": .int(c.unread), "noInteraction": .int(c.noInteraction), "total": .int(c.total)])
                }
            case .mySync, .myEvents:
                let d = try deviceAuth(req, tokenInQuery: true)
                try fallback(route, req, d, shard: shard, responder: responder)
            case .myDevice(let id):
                let d = try deviceAuth(req, namesDevice: false)
                guard Identifiers.isUserId(id) else { throw HeraldError.badRequest("bad device id") }
                if let bound = d.claims.device, bound != id {
                    throw HeraldError(.forbidden, "the token is bound to another device")
                }
                if req.method == "PUT" {
                    let reg = try DeviceRegistration(bytes: req.body)
                    exec.run { e in
                        let now = WallClock.now()
                        _ = try e.viewer(d.user, deviceId: id, registration: reg, now: now)
                        let device = try e.store.device(d.user, id: id)!
                        return .json(200, ["device": e.deviceJSON(d.user, device, now: now)])
                    }
                } else {
                    exec.run { e in
                        try e.deleteDevice(d.user, deviceId: id) ? .noContent : .error(HeraldError(.notFound, "no such device"))
                    }
                }
            }
        } catch {
            reply(.error(error))
        }
    }

    /// Runs engine work for one request and answers on the shard.
    struct Exec {
        let engine: Engine
        let shard: Shard
        let responder: HTTPResponder

        func run(_ body: @escaping @Sendable (Engine) throws -> HTTPResponse) {
            let shard = self.shard, responder = self.responder
            engine.submit({ e in
                let r = try body(e)
                e.afterCommit { shard.post { responder.respond(r) } }
            }, failed: { err in shard.post { responder.respond(.error(err)) } })
        }
    }

    // MARK: Authentication

    func serverAuth(_ req: HTTPRequest, _ appId: String) throws(HeraldError) -> AppConfig {
        guard let key = bearer(req) else { throw HeraldError(.unauthorized, "missing server key") }
        // An unknown app answers like a wrong key, so app ids do not leak.
        guard let app = apps[appId], constantTimeEquals(Array(key.utf8), Array(app.serverKey.utf8)) else {
            throw HeraldError(.unauthorized, "wrong server key for this app")
        }
        return app
    }

    /// The per-app publish rate (`publishesPerSecondPerApp`, burst twice that).
    func admitPublishes(_ appId: String, _ n: Int) throws(HeraldError) {
        let rate = Double(config.limits.publishesPerSecondPerApp)
        let now = WallClock.now()
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
        guard let h = req.headers["authorization"] else { return nil }
        let parts = h.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let t = parts[1].trimmingSpaces
        return t.isEmpty ? nil : String(t)
    }

    struct DeviceContext: Sendable {
        let claims: DeviceClaims
        let user: UserKey
        /// The device the client named, or its token is bound to; nil for an unnamed client.
        let deviceId: String?
    }

    func deviceAuth(_ req: HTTPRequest, tokenInQuery: Bool = false, namesDevice: Bool = true) throws(HeraldError) -> DeviceContext {
        guard let token = bearer(req) ?? (tokenInQuery ? req.queryValue("token") : nil) else {
            throw HeraldError(.unauthorized, "missing device token")
        }
        let claims = try verify(token: token).get()
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
        return DeviceContext(claims: claims, user: claims.userKey, deviceId: device)
    }

    func issueToken(_ app: AppConfig, _ t: TokenRequest, extra: JSONObject = [:]) -> JSON {
        let now = WallClock.now() / 1000
        let c = DeviceClaims(app: app.id, user: t.userId, device: t.deviceId, issuedAt: now, expiresAt: now + t.ttlSeconds)
        var o: JSONObject = ["token": .string(DeviceToken.sign(c, secret: app.tokenSecret)),
                             "expiresAt": .string(RFC3339.format(c.expiresAt * 1000))]
        for (k, v) in extra.pairs { o[k] = v }
        return .object(o)
    }

    // MARK: Notifications

    func history(_ req: HTTPRequest, _ user: UserKey, deviceId: String?, _ exec: Exec) throws(HeraldError) {
        var limit = 50
        if let l = req.queryValue("limit") {
            guard let v = Int(l), (1...500).contains(v) else { throw HeraldError.badRequest("limit must be 1 to 500") }
            limit = v
        }
        var before: HistoryKey? = nil
        if let b = req.queryValue("before") {
            guard let k = PageToken.decode(b) else { throw HeraldError.badRequest("before is not a page token") }
            before = k
        }
        var filter = Engine.HistoryFilter()
        if let r = req.queryValue("readState") {
            guard let v = ReadState(rawValue: r) else { throw HeraldError.badRequest("readState must be unread or read") }
            filter.readState = v
        }
        if let a = req.queryValue("userActionState") {
            guard let v = UserActionState(rawValue: a) else {
                throw HeraldError.badRequest("userActionState must be one of \(UserActionState.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            filter.userActionState = v
        }
        exec.run { [filter, before, limit] e in
            let v = try e.viewer(user, deviceId: deviceId, now: WallClock.now())
            let page = try e.history(user, viewer: v, filter: filter, before: before, limit: limit)
            return .json(200, ["notifications": .array(page.notifications.map(\.json)), "next": page.next.json])
        }
    }

    /// GET, PATCH and DELETE of one notification, for servers (no device)
    /// and devices alike.
    func notificationRoute(_ req: HTTPRequest, _ user: UserKey, deviceId: String?, id: String, _ exec: Exec) throws(HeraldError) {
        switch req.method {
        case "GET":
            exec.run { e in
                let v = try e.viewer(user, deviceId: deviceId, now: WallClock.now())
                guard let n = try e.visible(user, id: id, viewer: v) else { return .error(.notFound) }
                return .json(200, ["notification": n.json])
            }
        case "PATCH":
            let u = try StateUpdate(bytes: req.body, ifMatch: req.headers["if-match"])
            exec.run { e in
                let now = WallClock.now()
                let v = try e.viewer(user, deviceId: deviceId, now: now)
                switch try e.updateState(user, id: id, u, viewer: v, now: now) {
                case .success(let (n, seq)): return .json(200, ["notification": n.json, "seq": .int(seq)])
                case .failure(let err): return .error(err)
                }
            }
        default:
            exec.run { e in
                let now = WallClock.now()
                let v = try e.viewer(user, deviceId: deviceId, now: now)
                switch try e.delete(user, id: id, viewer: v, now: now) {
                case .success: return .noContent
                case .failure(let err): return .error(err)
                }
            }
        }
    }

    func bulkSend(_ app: AppConfig, _ send: BulkSend, _ exec: Exec) throws(HeraldError) {
        exec.run { e in
            let now = WallClock.now()
            let users: [String]
            switch send.audience {
            case .users(let ids): users = ids
            case .tags(let expr):
                users = try e.store.usersWithDevices(app: app.id).filter { entry in
                    entry.devices.contains { expr.matches(Set($0.allTags(userId: entry.user))) }
                }.map(\.user)
            }
            for u in users {
                if case .failure(let err) = try e.publish(UserKey(app: app.id, user: u), send.draft, now: now) {
                    return .error(err)
                }
            }
            return .json(202, ["users": .int(users.count)])
        }
    }

    // MARK: Demo page

    func staticFile(_ name: String) throws(HeraldError) -> HTTPResponse {
        guard let root = config.webRoot,
              let data = FileManager.default.contents(atPath: root + "/" + name) else { throw Route.notFound }
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
