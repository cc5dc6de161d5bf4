import XCTest
import HeraldTestSupport
import HeraldCore
@testable import HeraldGateway

/// The HTTP router (SPEC sections 2-4): never traps; an unknown path is
/// 404 for every method; a known path answers its methods and 405 for the
/// rest; ids are the path's segments, each percent-decoded on its own (a
/// malformed escape is 400). Checked against a reference router written
/// from the SPEC tables.
final class RouteFuzzTests: XCTestCase {

    static let methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]

    static let target = FuzzTarget(
        name: "route",
        dictionary: ["/", "//", "v1", "me", "apps", "users", "notifications", "devices", "tokens", "read-all", "counts",
                     "sync", "events", "ws", "healthz", "metrics", "demo", "token", "index.html", "herald.js", ".", "..",
                     "%2F", "%2e", "%", ";", "?", "#", "GET ", "POST ", "PUT ", "PATCH ", "DELETE ", "HEAD ", "get ", " "],
        maxLength: 8192,
        generate: { rng in Array(generateRequest(&rng).utf8) },
        check: { bytes in check(bytes) })

    func testFuzzRouter() { FuzzRunner.run(Self.target, test: self) }

    /// Input: `METHOD path` (no space: GET). Each is tried with and without --demo.
    static func split(_ bytes: [UInt8]) -> (String, String) {
        guard let sp = bytes.firstIndex(of: 0x20) else { return ("GET", String(decoding: bytes, as: UTF8.self)) }
        return (String(decoding: bytes[..<sp], as: UTF8.self), String(decoding: bytes[(sp + 1)...], as: UTF8.self))
    }

    /// A match as its path's pattern and values, `v1/me/devices/{deviceId} ["d1"]`, or its error's status.
    static func describe(_ r: Result<Route.Matched, HeraldError>) -> String {
        switch r {
        case .success(let m): return route(m.path.pattern, m.values)
        case .failure(let e): return "\(e.code.httpStatus)"
        }
    }

    static func describe(_ r: Result<String, HeraldError>) -> String {
        switch r {
        case .success(let route): return route
        case .failure(let e): return "\(e.code.httpStatus)"
        }
    }

    static func route(_ pattern: String, _ values: [String]) -> String { "\(pattern) \(values)" }

    static func check(_ bytes: [UInt8]) -> Outcome {
        let (method, path) = split(bytes)
        var accepted = false
        for demo in [false, true] {
            let r = Route.match(method: method, path: path, demo: demo)
            let expected = Reference.match(method: method, path: path, demo: demo)
            guard describe(r) == describe(expected) else {
                return .failed("\(method) \(path.debugDescription) demo=\(demo): router says \(describe(r)), the SPEC says \(describe(expected))")
            }
            switch r {
            case .success(let m):
                accepted = true
                // The credential a route takes, and the app whose key and origins it takes: its path's.
                let want = Reference.credential(m.path.pattern)
                guard m.route.credential == want.0, m.serverApp == want.1.map({ m.values[$0] }) else {
                    return .failed("\(describe(r)) takes \(m.route.credential) of \(String(describing: m.serverApp)), not \(want)")
                }
                if !demo, m.path.demoOnly { return .failed("demo route \(describe(r)) without --demo") }
            case .failure(let e):
                guard [.notFound, .methodNotAllowed, .badRequest].contains(e.code) else { return .failed("router answered \(e.code)") }
                // 405 only where another method works; 404 for every method alike.
                let others = (methods + [method]).map { Route.match(method: $0, path: path, demo: demo) }
                let anyWorks = others.contains { if case .success = $0 { true } else { false } }
                if e.code == .methodNotAllowed, !anyWorks { return .failed("405 for \(path.debugDescription) where no method works") }
                if e.code == .notFound, anyWorks { return .failed("404 for \(method) on \(path.debugDescription) where another method works") }
            }
        }
        return accepted ? .accepted : .rejected
    }

    // MARK: the known routes

    static let idBytes = Array("abcxyzABCXYZ0189._@:-".utf8)
    static func id(_ rng: inout SplitMix64) -> String {
        let n = rng.oneIn(8) ? rng.pick([64, 128]) : rng.range(1, 12)
        return String(decoding: (0..<n).map { _ in rng.pick(idBytes) }, as: UTF8.self)
    }

    /// (path, its route for each allowed method) for random valid ids.
    static func known(_ rng: inout SplitMix64) -> [(String, [String: String])] {
        let app = id(&rng), user = id(&rng), note = "n_" + id(&rng), dev = id(&rng)
        func one(_ pattern: String, _ values: [String], _ methods: String...) -> (String, [String: String]) {
            var path = pattern, rest = values[...]
            while let name = path.firstRange(of: /\{[a-zA-Z]+\}/) { path.replaceSubrange(name, with: rest.removeFirst()) }
            return ("/" + path, Dictionary(uniqueKeysWithValues: methods.map { ($0, route(pattern, values)) }))
        }
        return [
            one("healthz", [], "GET"),
            one("metrics", [], "GET"),
            one("v1/ws", [], "GET"),
            one("v1/apps/{app}/tokens", [app], "POST"),
            one("v1/apps/{app}/notifications", [app], "POST"),
            one("v1/apps/{app}/users/{user}/notifications", [app, user], "GET", "POST"),
            one("v1/apps/{app}/users/{user}/notifications/{id}", [app, user, note], "GET", "PATCH", "DELETE"),
            one("v1/apps/{app}/users/{user}/devices", [app, user], "GET"),
            one("v1/apps/{app}/users/{user}/devices/{deviceId}", [app, user, dev], "PUT", "DELETE"),
            one("v1/me/notifications", [], "GET"),
            one("v1/me/notifications/{id}", [note], "GET", "PATCH", "DELETE"),
            one("v1/me/notifications/read-all", [], "POST"),
            one("v1/me/counts", [], "GET"),
            one("v1/me/sync", [], "GET"),
            one("v1/me/events", [], "GET"),
            one("v1/me/push", [], "GET"),
            one("v1/me/devices/{deviceId}", [dev], "PUT", "DELETE"),
        ]
    }

    static func generateRequest(_ rng: inout SplitMix64) -> String {
        let k = rng.pick(known(&rng))
        return rng.pick(methods) + " " + k.0
    }

    /// Every known path with random ids matches its route for its methods,
    /// answers 405 for the others, and 404 once a segment is added, removed
    /// or misspelled.
    func testKnownPathsMatchTheirRoutes() {
        var rng = SplitMix64(seed: FuzzRunner.seed(for: "route-known"))
        for _ in 0..<300 {
            for (path, routes) in Self.known(&rng) {
                for demo in [false, true] {
                    for m in Self.methods {
                        let r = Route.match(method: m, path: path, demo: demo)
                        // HEAD is answered wherever GET is (RFC 9110 9.3.2).
                        if let route = routes[m] ?? (m == "HEAD" ? routes["GET"] : nil) {
                            XCTAssertEqual(Self.describe(r), route, "\(m) \(path)")
                        } else {
                            XCTAssertEqual(Self.describe(r), "405", "\(m) \(path)")
                        }
                    }
                    // A segment added, a slash too many, a misspelled prefix: 404 for every method.
                    for bad in [path + "/x/y", path + "/", "x" + path, path + "//", "/v2" + path.dropFirst(3),
                                path.replacingOccurrences(of: "/v1/", with: "/V1/"), "/" + path] where bad != path {
                        for m in Self.methods {
                            XCTAssertEqual(Self.describe(Route.match(method: m, path: bad, demo: false)), "404", "\(m) \(bad)")
                        }
                    }
                }
            }
        }
        XCTAssertEqual(Self.describe(Route.match(method: "POST", path: "/v1/demo/token", demo: true)), "v1/demo/token []")
        XCTAssertEqual(Self.describe(Route.match(method: "POST", path: "/v1/demo/token", demo: false)), "404")
        XCTAssertEqual(Self.describe(Route.match(method: "GET", path: "/", demo: false)), "404")
        XCTAssertEqual(Self.describe(Route.match(method: "GET", path: "/", demo: true)), " [\"index.html\"]")
        XCTAssertEqual(Self.describe(Route.match(method: "GET", path: "/v1/me/notifications/read-all", demo: false)), "405")
    }

    /// SPEC sections 2-4 and 6 as a table, on byte segments.
    enum Reference {
        static func match(method: String, path: String, demo: Bool) -> Result<String, HeraldError> {
            let b = Array(path.utf8)
            guard b.first == UInt8(ascii: "/") else { return .failure(HeraldError(.notFound, "")) }
            let raw = b.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).dropFirst()
            let segments = raw.compactMap(decode)
            guard segments.count == raw.count else { return .failure(HeraldError(.badRequest, "")) }
            let routes = lookup(path, segments, demo: demo)
            guard !routes.isEmpty else { return .failure(HeraldError(.notFound, "")) }
            // HEAD wherever GET (RFC 9110 9.3.2).
            guard let route = routes[method] ?? (method == "HEAD" ? routes["GET"] : nil) else {
                return .failure(HeraldError(.methodNotAllowed, ""))
            }
            return .success(route)
        }

        /// RFC 3986 percent-decoding of one segment: nil for an escape that
        /// is not `%` and two hex digits, or bytes that are not UTF-8.
        static func decode(_ segment: ArraySlice<UInt8>) -> String? {
            let hex = Array("0123456789abcdefABCDEF".utf8)
            var out: [UInt8] = []
            var i = segment.startIndex
            while i < segment.endIndex {
                if segment[i] == UInt8(ascii: "%") {
                    guard i + 2 < segment.endIndex, hex.contains(segment[i + 1]), hex.contains(segment[i + 2]) else { return nil }
                    out.append(UInt8(String(decoding: segment[(i + 1)...(i + 2)], as: UTF8.self), radix: 16)!)
                    i += 3
                } else {
                    out.append(segment[i])
                    i += 1
                }
            }
            return String(validating: out, as: UTF8.self)
        }

        /// The credential a route of `pattern` takes, and where the app it
        /// proves is among its values (SPEC sections 2, 3, 9, 10).
        static func credential(_ pattern: String) -> (Route.Credential, Int?) {
            if pattern.hasPrefix("v1/apps/") { return (.serverKey, 0) }
            if ["healthz", "metrics", "v1/ws", "v1/demo/token", "", "{file}"].contains(pattern) { return (.none, nil) }
            return (.deviceToken(inQuery: ["v1/me/sync", "v1/me/events"].contains(pattern)), nil)
        }

        static func lookup(_ path: String, _ s: [String], demo: Bool) -> [String: String] {
            let b = Array(path.utf8)
            func one(_ pattern: String, _ values: [String], _ methods: String...) -> [String: String] {
                Dictionary(uniqueKeysWithValues: methods.map { ($0, route(pattern, values)) })
            }
            switch s {
            case ["healthz"]: return one("healthz", [], "GET")
            case ["metrics"]: return one("metrics", [], "GET")
            case ["v1", "ws"]: return one("v1/ws", [], "GET")
            case ["v1", "demo", "token"] where demo: return one("v1/demo/token", [], "POST")
            case ["v1", "me", "notifications"]: return one("v1/me/notifications", [], "GET")
            case ["v1", "me", "counts"]: return one("v1/me/counts", [], "GET")
            case ["v1", "me", "sync"]: return one("v1/me/sync", [], "GET")
            case ["v1", "me", "events"]: return one("v1/me/events", [], "GET")
            case ["v1", "me", "push"]: return one("v1/me/push", [], "GET")
            case ["v1", "me", "notifications", "read-all"]: return one("v1/me/notifications/read-all", [], "POST")
            default: break
            }
            if s.count == 4, s[0] == "v1", s[1] == "me", s[2] == "notifications", !s[3].isEmpty {
                return one("v1/me/notifications/{id}", [s[3]], "GET", "PATCH", "DELETE")
            }
            if s.count == 4, s[0] == "v1", s[1] == "me", s[2] == "devices", !s[3].isEmpty {
                return one("v1/me/devices/{deviceId}", [s[3]], "PUT", "DELETE")
            }
            if s.count >= 4, s[0] == "v1", s[1] == "apps", !s[2].isEmpty {
                let app = s[2]
                if s.count == 4, s[3] == "tokens" { return one("v1/apps/{app}/tokens", [app], "POST") }
                if s.count == 4, s[3] == "notifications" { return one("v1/apps/{app}/notifications", [app], "POST") }
                if s.count >= 6, s[3] == "users", !s[4].isEmpty {
                    let user = s[4], of = "v1/apps/{app}/users/{user}/"
                    if s.count == 6, s[5] == "notifications" { return one(of + "notifications", [app, user], "GET", "POST") }
                    if s.count == 6, s[5] == "devices" { return one(of + "devices", [app, user], "GET") }
                    if s.count == 7, s[5] == "notifications", !s[6].isEmpty {
                        return one(of + "notifications/{id}", [app, user, s[6]], "GET", "PATCH", "DELETE")
                    }
                    if s.count == 7, s[5] == "devices", !s[6].isEmpty { return one(of + "devices/{deviceId}", [app, user, s[6]], "PUT", "DELETE") }
                }
            }
            // Demo web root: `/` and plain file names (no dot first, <= 64).
            if demo {
                if path == "/" { return one("", ["index.html"], "GET") }
                let name = b.dropFirst()
                let ok = !name.isEmpty && name.count <= 64 && name.first != UInt8(ascii: ".") && name.allSatisfy {
                    ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x30 && $0 <= 0x39) || "_@#.-".utf8.contains($0)
                }
                if ok, s.count == 1 { return one("{file}", [String(decoding: name, as: UTF8.self)], "GET") }
            }
            return [:]
        }
    }
}
