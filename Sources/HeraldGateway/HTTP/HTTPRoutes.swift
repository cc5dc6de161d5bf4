import HeraldCore
import HeraldPorts

/// One route of the HTTP API (SPEC sections 2-4, 6 and 10): a method of a
/// path of `Path.all`, and its handler, whose case is the credential the
/// route takes. Matching comes before authentication: an unknown path is
/// 404, a known path with another method 405; `Gateway.handle` then checks
/// the credential and calls the handler with what it proved. (Routes and
/// paths are classes: a match holds them by reference, a retain each.)
final class Route: Sendable {
    typealias Open = @Sendable (Gateway, Gateway.Call) throws(HeraldError) -> Void
    typealias App = @Sendable (Gateway, Gateway.Call, AppConfig) throws(HeraldError) -> Void
    typealias User = @Sendable (Gateway, Gateway.Call, UserKey) throws(HeraldError) -> Void
    typealias Device = @Sendable (Gateway, Gateway.Call, Gateway.DeviceContext) throws(HeraldError) -> Void

    /// What a request must carry, and so the app it proves (CORS).
    enum Credential: Equatable, Sendable {
        /// Nothing: the route proves no app.
        case none
        /// A server key of the path's `{app}`.
        case serverKey
        /// A device token as a bearer, or with `inQuery` also as `?token=`
        /// (EventSource cannot set headers).
        case deviceToken(inQuery: Bool)
    }

    enum Handler: Sendable {
        /// No credential.
        case open(Open)
        /// A server key of the path's `{app}`: the handler gets that app.
        case app(App)
        /// A server key of the path's `{app}`, and its `{user}` a user id
        /// (else 400): the handler gets that user.
        case user(User)
        /// A device token; `namesDevice`: the request may name its device
        /// (`Herald-Device`, `?deviceId=`), which the handler gets in the
        /// context.
        case device(inQuery: Bool = false, namesDevice: Bool = true, Device)
    }

    let method: String
    let handler: Handler

    init(_ method: String, _ handler: Handler) { self.method = method; self.handler = handler }

    var credential: Credential {
        switch handler {
        case .open: .none
        case .app, .user: .serverKey
        case .device(let inQuery, _, _): .deviceToken(inQuery: inQuery)
        }
    }

    /// A request's route, its path and the path's `{name}` values in order.
    struct Matched {
        let route: Route
        let path: Path
        let values: [String]

        /// The `{app}` of a server route's path: whose server key it takes
        /// (and whose origins it admits, CORS).
        var serverApp: String? { path.appIndex.map { values[$0] } }
        var serverUser: String? { path.userIndex.map { values[$0] } }
    }

    static func match(method: String, path: String, demo: Bool) -> Result<Matched, HeraldError> {
        guard path.utf8.first == UInt8(ascii: "/") else { return .failure(notFound) }
        // Split before decoding: an encoded `/` belongs to its segment (and
        // makes a bad id there), and `.` or `..` are ids, not navigation.
        // Bytes, not Characters: a `/` followed by a combining mark is one
        // Character, and still a separator.
        var s: [String] = []
        for segment in path.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).dropFirst() {
            guard let decoded = HTTPWire.percentDecoded(Substring(segment)) else {
                return .failure(.badRequest("malformed percent-encoding in the path"))
            }
            s.append(decoded)
        }
        let p: Path, values: [String]
        if let found = Path.find(s, demo: demo) {
            (p, values) = found
        } else {
            guard demo, let name = staticName(path) else { return .failure(notFound) }
            (p, values) = path == "/" ? (Path.demoPages[0], [name]) : (Path.demoPages[1], [name])
        }
        // HEAD is GET without the body (RFC 9110 9.3.2): the transport drops it.
        let routed = method == "HEAD" ? "GET" : method
        guard let route = p.routes.first(where: { $0.method == routed }) else {
            let allowed = p.allowedMethods
            return .failure(HeraldError(.methodNotAllowed, "\(method) is not allowed here; use \(allowed.joined(separator: ", "))",
                                        allowedMethods: allowed))
        }
        return .success(Matched(route: route, path: p, values: values))
    }

    /// One path of the API and its routes by method. Its segments are
    /// literals or `{name}`, any non-empty segment, whose values go to the
    /// handler in order; `{app}` makes its routes server routes of that app.
    final class Path: Sendable {
        enum Segment: Sendable { case literal(String), value }

        let pattern: String
        let segments: [Segment]
        /// Where `{app}` and `{user}` are among the values.
        let appIndex: Int?
        let userIndex: Int?
        let demoOnly: Bool
        let routes: [Route]

        init(_ pattern: String, demoOnly: Bool = false, _ routes: [Route]) {
            let parts = pattern.split(separator: "/").map(String.init)
            let names = parts.filter { $0.hasPrefix("{") }
            self.pattern = pattern
            segments = parts.map { $0.hasPrefix("{") ? .value : .literal($0) }
            appIndex = names.firstIndex(of: "{app}")
            userIndex = names.firstIndex(of: "{user}")
            self.demoOnly = demoOnly
            self.routes = routes
            for r in routes {
                switch r.handler {
                case .app: precondition(appIndex != nil, "\(r.method) \(pattern): a server key proves the path's {app}")
                case .user: precondition(appIndex != nil && userIndex != nil, "\(r.method) \(pattern): a server route of a {user}")
                case .open, .device: precondition(appIndex == nil, "\(r.method) \(pattern): a path's {app} takes its server key")
                }
            }
        }

        /// What `Allow` lists: the routes' methods, and HEAD wherever GET is.
        var allowedMethods: [String] {
            let methods = routes.map(\.method)
            return (methods.contains("GET") ? methods + ["HEAD"] : methods).sorted()
        }

        /// The first path `s` (decoded segments) is, and its values.
        static func find(_ s: [String], demo: Bool) -> (Path, [String])? {
            search: for p in all where p.segments.count == s.count && (demo || !p.demoOnly) {
                var values: [String] = []
                for (segment, want) in zip(s, p.segments) {
                    switch want {
                    case .literal(let l): guard segment == l else { continue search }
                    case .value:
                        guard !segment.isEmpty else { continue search }
                        values.append(segment)
                    }
                }
                return (p, values)
            }
            return nil
        }

        /// A notification's routes, by its server or by its device.
        static func notification(server: Bool) -> [Route] {
            func one(_ method: String, _ h: @escaping @Sendable (Gateway, Gateway.Call, UserKey, String?) throws(HeraldError) -> Void) -> Route {
                server ? Route(method, .user { g, c, user throws(HeraldError) in try h(g, c, user, nil) })
                    : Route(method, .device { g, c, d throws(HeraldError) in try h(g, c, d.user, d.deviceId) })
            }
            return [one("GET") { g, c, user, device throws(HeraldError) in try g.getNotification(c, user, device) },
                    one("PATCH") { g, c, user, device throws(HeraldError) in try g.updateNotification(c, user, device) },
                    one("DELETE") { g, c, user, device throws(HeraldError) in try g.deleteNotification(c, user, device) }]
        }

        /// Preferences' routes (SPEC section 12), by a user's server or by a
        /// device of the user: they are the user's, so the device's name
        /// changes nothing but who a save's webhook event says made it.
        static func preferences(server: Bool) -> [Route] {
            func one(_ method: String, _ h: @escaping @Sendable (Gateway, Gateway.Call, UserKey, ChangeActor) throws(HeraldError) -> Void) -> Route {
                server ? Route(method, .user { g, c, user throws(HeraldError) in try h(g, c, user, .app) })
                    : Route(method, .device { g, c, d throws(HeraldError) in try h(g, c, d.user, .device(d.deviceId)) })
            }
            return [one("GET") { g, c, user, _ in g.preferences(c, user) },
                    one("PUT") { g, c, user, actor throws(HeraldError) in try g.savePreferences(c, user, by: actor) }]
        }

        /// SPEC sections 2-4, 6, 10 and 12, as docs/openapi.yaml names them.
        /// The first match wins: `read-all` and `seen-all` before the notification ids.
        static let all: [Path] = [
            Path("healthz", [Route("GET", .open { g, c in g.health(c) })]),
            Path("metrics", [Route("GET", .open { g, c in g.metricsText(c) })]),
            Path("v1/ws", [Route("GET", .open { _, _ throws(HeraldError) in throw Gateway.upgradeExpected })]),
            Path("v1/demo/token", demoOnly: true, [Route("POST", .open { g, c throws(HeraldError) in try g.demoToken(c) })]),
            Path("v1/me/notifications",
                 [Route("GET", .device { g, c, d throws(HeraldError) in try g.history(c, d.user, d.deviceId) })]),
            Path("v1/me/counts", [Route("GET", .device { g, c, d in g.counts(c, d) })]),
            Path("v1/me/sync",
                 [Route("GET", .device(inQuery: true) { g, c, d throws(HeraldError) in try g.fallback(events: false, c, d) })]),
            Path("v1/me/events",
                 [Route("GET", .device(inQuery: true) { g, c, d throws(HeraldError) in try g.fallback(events: true, c, d) })]),
            Path("v1/me/push", [Route("GET", .device(namesDevice: false) { g, c, d in g.pushServices(c, d) })]),
            Path("v1/me/notifications/read-all", [Route("POST", .device { g, c, d in g.readAll(c, d) })]),
            Path("v1/me/notifications/seen-all", [Route("POST", .device { g, c, d in g.seenAll(c, d) })]),
            Path("v1/me/notifications/{id}", notification(server: false)),
            Path("v1/me/preferences", preferences(server: false)),
            Path("v1/me/devices/{deviceId}",
                 [Route("PUT", .device(namesDevice: false) { g, c, d throws(HeraldError) in try g.registerDevice(c, d) }),
                  Route("DELETE", .device(namesDevice: false) { g, c, d throws(HeraldError) in try g.deleteDevice(c, d) })]),
            Path("v1/apps/{app}/tokens", [Route("POST", .app { g, c, app throws(HeraldError) in try g.issueToken(c, app) })]),
            Path("v1/apps/{app}/notifications", [Route("POST", .app { g, c, app throws(HeraldError) in try g.bulkSend(c, app) })]),
            Path("v1/apps/{app}/users/{user}/notifications",
                 [Route("GET", .user { g, c, user throws(HeraldError) in try g.history(c, user, nil) }),
                  Route("POST", .user { g, c, user throws(HeraldError) in try g.publish(c, user) })]),
            Path("v1/apps/{app}/inspect", [Route("GET", .app { g, c, app in g.inspectApp(c, app) })]),
            Path("v1/apps/{app}/users/{user}/inspect",
                 [Route("GET", .user { g, c, user throws(HeraldError) in try g.inspectUser(c, user) })]),
            Path("v1/apps/{app}/users/{user}/devices", [Route("GET", .user { g, c, user in g.listDevices(c, user) })]),
            Path("v1/apps/{app}/users/{user}/notifications/{id}", notification(server: true)),
            Path("v1/apps/{app}/users/{user}/preferences", preferences(server: true)),
            Path("v1/apps/{app}/users/{user}/devices/{deviceId}",
                 [Route("PUT", .user { g, c, user throws(HeraldError) in try g.registerDevice(c, user) }),
                  Route("DELETE", .user { g, c, user throws(HeraldError) in try g.deleteDevice(c, user) })]),
            // The inspector's page (docs/PROTOCOL.md section 18), demo mode or not.
            Path("admin", [Route("GET", .open { g, c throws(HeraldError) in c.x.responder.respond(try g.adminFile("index.html")) })]),
            Path("admin/{file}", [Route("GET", .open { g, c throws(HeraldError) in c.x.responder.respond(try g.adminFile(c.values[0])) })]),
        ]

        /// The demo page's files (`--demo`): `/` is `index.html`. Matched
        /// on the raw path (`staticName`) once no path of `all` is.
        static let demoPages: [Path] = ["", "{file}"].map {
            Path($0, demoOnly: true, [Route("GET", .open { g, c throws(HeraldError) in c.x.responder.respond(try g.staticFile(c.values[0])) })])
        }
    }

    static let notFound = HeraldError(.notFound, "no such resource")

    /// Demo page files: `/` and plain file names in the web root.
    static func staticName(_ path: String) -> String? {
        if path == "/" { return "index.html" }
        let name = Substring(path.utf8.dropFirst())
        return isFileName(name) ? String(name) : nil
    }

    /// A plain file name of a served folder: no path, nothing hidden.
    static func isFileName(_ name: Substring) -> Bool {
        let bytes = name.utf8
        return !bytes.isEmpty && bytes.count <= 64 && bytes.first != UInt8(ascii: ".")
            && bytes.allSatisfy { Identifiers.isTag(String(UnicodeScalar($0))) && $0 != UInt8(ascii: ":") }
    }
}
