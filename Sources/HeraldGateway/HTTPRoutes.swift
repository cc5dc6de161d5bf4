import HeraldCore

/// The HTTP routes of SPEC sections 2-4 and 6. Matching comes before
/// authentication: an unknown path is 404, a known path with another
/// method 405.
enum Route: Equatable {
    case health, metrics, webSocket, demoToken
    case tokens(app: String)
    case bulkSend(app: String)
    case userNotifications(app: String, user: String)
    case userNotification(app: String, user: String, id: String)
    case userDevices(app: String, user: String)
    case myNotifications
    case myReadAll
    case myNotification(id: String)
    case myCounts, mySync, myEvents
    case myDevice(id: String)
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
        let (route, methods): (Route?, [String]) = {
            switch s.count {
            case 1 where s[0] == "healthz": return (.health, ["GET"])
            case 1 where s[0] == "metrics": return (.metrics, ["GET"])
            case 2 where s[0] == "v1" && s[1] == "ws": return (.webSocket, ["GET"])
            case 3 where s[0] == "v1" && s[1] == "demo" && s[2] == "token" && demo: return (.demoToken, ["POST"])
            case 3 where s[0] == "v1" && s[1] == "me":
                switch s[2] {
                case "notifications": return (.myNotifications, ["GET"])
                case "counts": return (.myCounts, ["GET"])
                case "sync": return (.mySync, ["GET"])
                case "events": return (.myEvents, ["GET"])
                default: return (nil, [])
                }
            case 4 where s[0] == "v1" && s[1] == "me" && s[2] == "notifications":
                if s[3] == "read-all" { return (.myReadAll, ["POST"]) }
                return s[3].isEmpty ? (nil, []) : (.myNotification(id: s[3]), ["GET", "PATCH", "DELETE"])
            case 4 where s[0] == "v1" && s[1] == "me" && s[2] == "devices" && !s[3].isEmpty:
                return (.myDevice(id: s[3]), ["PUT", "DELETE"])
            case 4 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "tokens":
                return (.tokens(app: s[2]), ["POST"])
            case 4 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "notifications":
                return (.bulkSend(app: s[2]), ["POST"])
            case 6 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "users" && !s[4].isEmpty:
                switch s[5] {
                case "notifications": return (.userNotifications(app: s[2], user: s[4]), ["GET", "POST"])
                case "devices": return (.userDevices(app: s[2], user: s[4]), ["GET"])
                default: return (nil, [])
                }
            case 7 where s[0] == "v1" && s[1] == "apps" && !s[2].isEmpty && s[3] == "users" && !s[4].isEmpty
                && s[5] == "notifications" && !s[6].isEmpty:
                return (.userNotification(app: s[2], user: s[4], id: s[6]), ["GET", "PATCH", "DELETE"])
            default:
                if demo, let name = staticName(path) { return (.staticFile(name: name), ["GET"]) }
                return (nil, [])
            }
        }()
        guard let route else { return .failure(notFound) }
        guard methods.contains(method) else {
            return .failure(HeraldError(.methodNotAllowed, "\(method) is not allowed here; use \(methods.joined(separator: ", "))"))
        }
        return .success(route)
    }

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
