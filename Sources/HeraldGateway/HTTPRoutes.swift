import HeraldCore

/// The HTTP routes of SPEC sections 2-4, 6 and 10: one entry per method and
/// path of `Path.all`. Matching comes before authentication: an unknown path
/// is 404, a known path with another method 405.
enum Route: Equatable {
    /// Whose notifications: an app server's view of one user, or a device's own.
    enum Owner: Equatable {
        case server(app: String, user: String)
        case device
    }

    case health, metrics, webSocket, demoToken
    case issueToken(app: String)
    case bulkSend(app: String)
    case publish(app: String, user: String)
    case history(Owner)
    case getNotification(Owner, id: String)
    case updateNotification(Owner, id: String)
    case deleteNotification(Owner, id: String)
    case listDevices(app: String, user: String)
    /// An app server registering or deleting a device (SPEC section 10, as Notification Hubs installations).
    case serverRegisterDevice(app: String, user: String, id: String)
    case serverDeleteDevice(app: String, user: String, id: String)
    case readAll, counts, sync, events, pushServices
    case registerDevice(id: String)
    case deleteDevice(id: String)
    case staticFile(name: String)

    /// A request's route, and the app of a server route: the `{app}` of its
    /// path, whose server key it takes (and whose origins it admits, CORS).
    struct Matched {
        let route: Route
        let serverApp: String?
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
        func notAllowed(_ allowed: [String]) -> Result<Matched, HeraldError> {
            .failure(HeraldError(.methodNotAllowed, "\(method) is not allowed here; use \(allowed.joined(separator: ", "))",
                                 allowedMethods: allowed))
        }
        guard let (p, values) = Path.find(s, demo: demo) else {
            guard demo, let name = staticName(path) else { return .failure(notFound) }
            return method == "GET" ? .success(Matched(route: .staticFile(name: name), serverApp: nil)) : notAllowed(["GET"])
        }
        guard let make = p.methods.first(where: { $0.method == method })?.make else { return notAllowed(p.methods.map(\.method).sorted()) }
        return .success(Matched(route: make(values), serverApp: p.appIndex.map { values[$0] }))
    }

    /// One path of the API and its routes by method. Its segments are
    /// literals or `{name}`, any non-empty segment, whose values go to
    /// `make` in order; `{app}` makes its routes server routes of that app.
    struct Path: Sendable {
        enum Segment: Sendable { case literal(String), value }
        typealias Make = @Sendable ([String]) -> Route

        let pattern: String
        let segments: [Segment]
        /// Where `{app}` is among the values.
        let appIndex: Int?
        let demoOnly: Bool
        let methods: [(method: String, make: Make)]

        init(_ pattern: String, demoOnly: Bool = false, _ methods: [(String, Make)]) {
            let parts = pattern.split(separator: "/").map(String.init)
            self.pattern = pattern
            segments = parts.map { $0.hasPrefix("{") ? .value : .literal($0) }
            appIndex = parts.filter { $0.hasPrefix("{") }.firstIndex(of: "{app}")
            self.demoOnly = demoOnly
            self.methods = methods.map { (method: $0.0, make: $0.1) }
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

        static func notification(_ owner: @escaping @Sendable ([String]) -> Owner) -> [(String, Make)] {
            [("GET", { .getNotification(owner($0), id: $0.last!) }), ("PATCH", { .updateNotification(owner($0), id: $0.last!) }),
             ("DELETE", { .deleteNotification(owner($0), id: $0.last!) })]
        }

        /// SPEC sections 2-4, 6 and 10. The first match wins: `read-all`
        /// before the notification ids.
        static let all: [Path] = [
            Path("healthz", [("GET", { _ in .health })]),
            Path("metrics", [("GET", { _ in .metrics })]),
            Path("v1/ws", [("GET", { _ in .webSocket })]),
            Path("v1/demo/token", demoOnly: true, [("POST", { _ in .demoToken })]),
            Path("v1/me/notifications", [("GET", { _ in .history(.device) })]),
            Path("v1/me/counts", [("GET", { _ in .counts })]),
            Path("v1/me/sync", [("GET", { _ in .sync })]),
            Path("v1/me/events", [("GET", { _ in .events })]),
            Path("v1/me/push", [("GET", { _ in .pushServices })]),
            Path("v1/me/notifications/read-all", [("POST", { _ in .readAll })]),
            Path("v1/me/notifications/{id}", notification { _ in .device }),
            Path("v1/me/devices/{id}", [("PUT", { .registerDevice(id: $0[0]) }), ("DELETE", { .deleteDevice(id: $0[0]) })]),
            Path("v1/apps/{app}/tokens", [("POST", { .issueToken(app: $0[0]) })]),
            Path("v1/apps/{app}/notifications", [("POST", { .bulkSend(app: $0[0]) })]),
            Path("v1/apps/{app}/users/{user}/notifications",
                 [("GET", { .history(.server(app: $0[0], user: $0[1])) }), ("POST", { .publish(app: $0[0], user: $0[1]) })]),
            Path("v1/apps/{app}/users/{user}/devices", [("GET", { .listDevices(app: $0[0], user: $0[1]) })]),
            Path("v1/apps/{app}/users/{user}/notifications/{id}", notification { .server(app: $0[0], user: $0[1]) }),
            Path("v1/apps/{app}/users/{user}/devices/{id}",
                 [("PUT", { .serverRegisterDevice(app: $0[0], user: $0[1], id: $0[2]) }),
                  ("DELETE", { .serverDeleteDevice(app: $0[0], user: $0[1], id: $0[2]) })]),
        ]
    }

    /// EventSource cannot set headers: these routes also take `?token=`.
    var takesTokenInQuery: Bool { self == .sync || self == .events }

    static let notFound = HeraldError(.notFound, "no such resource")

    /// Demo page files: `/` and plain file names in the web root.
    static func staticName(_ path: String) -> String? {
        if path == "/" { return "index.html" }
        let name = path.utf8.dropFirst()
        guard !name.isEmpty, name.count <= 64, name.first != UInt8(ascii: "."),
              name.allSatisfy({ Identifiers.isTag(String(UnicodeScalar($0))) && $0 != UInt8(ascii: ":") })
        else { return nil }
        return String(Substring(name))
    }
}
