import HeraldCore

/// The HTTP routes of SPEC sections 2-4 and 6: one entry per method and
/// path. Matching comes before authentication: an unknown path is 404, a
/// known path with another method 405.
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

    static func match(method: String, path: String, demo: Bool) -> Result<Route, HeraldError> {
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
        let methods = table(s, path: path, demo: demo)
        guard !methods.isEmpty else { return .failure(notFound) }
        guard let route = methods.first(where: { $0.key == method })?.value else {
            let allowed = methods.map(\.key).sorted()
            return .failure(HeraldError(.methodNotAllowed, "\(method) is not allowed here; use \(allowed.joined(separator: ", "))",
                                        allowedMethods: allowed))
        }
        return .success(route)
    }

    /// The routes of one path, by method (empty: no such path). Pairs, not
    /// a dictionary: at most three, built for every request.
    private static func table(_ s: [String], path: String, demo: Bool) -> KeyValuePairs<String, Route> {
        func notification(_ o: Owner, _ id: String) -> KeyValuePairs<String, Route> {
            ["GET": .getNotification(o, id: id), "PATCH": .updateNotification(o, id: id), "DELETE": .deleteNotification(o, id: id)]
        }
        switch s.count {
        case 1 where s[0] == "healthz": return ["GET": .health]
        case 1 where s[0] == "metrics": return ["GET": .metrics]
        case 2 where s[0] == "v1" && s[1] == "ws": return ["GET": .webSocket]
        case 3 where s[0] == "v1" && s[1] == "demo" && s[2] == "token" && demo: return ["POST": .demoToken]
        case 3 where s[0] == "v1" && s[1] == "me":
            switch s[2] {
            case "notifications": return ["GET": .history(.device)]
            case "counts": return ["GET": .counts]
            case "sync": return ["GET": .sync]
            case "events": return ["GET": .events]
            case "push": return ["GET": .pushServices]
            default: return [:]
            }
        case 4 where s[0] == "v1" && s[1] == "me" && s[2] == "notifications":
            if s[3] == "read-all" { return ["POST": .readAll] }
            return s[3].isEmpty ? [:] : notification(.device, s[3])
        case 4 where s[0] == "v1" && s[1] == "me" && s[2] == "devices" && !s[3].isEmpty:
            return ["PUT": .registerDevice(id: s[3]), "DELETE": .deleteDevice(id: s[3])]
        case 4 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "tokens":
            return ["POST": .issueToken(app: s[2])]
        case 4 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "notifications":
            return ["POST": .bulkSend(app: s[2])]
        case 6 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "users" && !s[4].isEmpty:
            switch s[5] {
            case "notifications": return ["GET": .history(.server(app: s[2], user: s[4])), "POST": .publish(app: s[2], user: s[4])]
            case "devices": return ["GET": .listDevices(app: s[2], user: s[4])]
            default: return [:]
            }
        case 7 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "users" && !s[4].isEmpty
            && s[5] == "notifications" && !s[6].isEmpty:
            return notification(.server(app: s[2], user: s[4]), s[6])
        case 7 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "users" && !s[4].isEmpty
            && s[5] == "devices" && !s[6].isEmpty:
            return ["PUT": .serverRegisterDevice(app: s[2], user: s[4], id: s[6]),
                    "DELETE": .serverDeleteDevice(app: s[2], user: s[4], id: s[6])]
        default:
            if demo, let name = staticName(path) { return ["GET": .staticFile(name: name)] }
            return [:]
        }
    }

    /// The app a server route names (its server key is that app's).
    var serverApp: String? {
        switch self {
        case .issueToken(let app), .bulkSend(let app), .publish(let app, _), .listDevices(let app, _): app
        case .history(.server(let app, _)), .getNotification(.server(let app, _), _), .updateNotification(.server(let app, _), _),
             .deleteNotification(.server(let app, _), _): app
        default: nil
        }
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
