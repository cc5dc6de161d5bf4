import HeraldPorts
import XCTest
import HeraldCore
@testable import HeraldGateway

/// Browser pages on other origins: preflights, the CORS headers of answers
/// (decided by the app the credentials prove), and the WebSocket origin check.
final class CORSTests: XCTestCase {
    static let page = "https://app.example.com"
    /// Allows `page`; `other` allows nothing; `open` allows every origin.
    static let listed = AppConfig(id: "listed", serverKey: "sk-l", tokenSecret: "ts-l", allowedOrigins: ["http://localhost:5173", page])
    static let other = AppConfig(id: "other", serverKey: "sk-o", tokenSecret: "ts-o")
    static let open = AppConfig(id: "open", serverKey: "sk-w", tokenSecret: "ts-w", allowedOrigins: ["*"])

    func harness(_ apps: [AppConfig] = [listed, other]) -> Harness { Harness(apps: apps) }

    func preflight(_ h: Harness, _ path: String, origin: String, method: String? = "PATCH") -> RecordingResponder {
        var headers = ["origin": origin]
        if let method { headers["access-control-request-method"] = method }
        return h.request("OPTIONS", path, headers: headers)
    }

    func testPreflightFromAnAllowedOriginNamesThePathsMethodsAndTheHeadersHeraldReads() throws {
        let h = harness()
        let r = try XCTUnwrap(preflight(h, "/v1/me/notifications/n1", origin: Self.page).response)
        XCTAssertEqual(r.status, 204)
        XCTAssertEqual(r.header("Access-Control-Allow-Origin"), Self.page)
        XCTAssertEqual(r.header("Access-Control-Allow-Methods"), "DELETE, GET, HEAD, PATCH")
        XCTAssertEqual(r.header("Access-Control-Allow-Headers"), "Authorization, Content-Type, If-Match, Herald-Device, Last-Event-ID")
        XCTAssertEqual(r.header("Access-Control-Max-Age"), "600")
        XCTAssertEqual(r.header("Vary"), "Origin")
        XCTAssertNil(r.header("Access-Control-Allow-Credentials"), "bearer tokens, no cookies")
        // The requested method is the browser's to check against the list.
        XCTAssertEqual(preflight(h, "/v1/me/counts", origin: Self.page, method: "DELETE").response?.header("Access-Control-Allow-Methods"), "GET, HEAD")
        // No credentials in a preflight: a server path of an app that allows nothing is let through too.
        XCTAssertEqual(preflight(h, "/v1/apps/other/users/u/notifications", origin: Self.page).response?.status, 204)
    }

    func testAnOriginNoAppAllowsGetsNoCORSHeadersAndOPTIONSStays405() throws {
        let h = harness()
        for origin in ["https://evil.example", "https://app.example.com:8443", "null"] {
            let a = try XCTUnwrap(preflight(h, "/v1/me/notifications/n1", origin: origin).response)
            XCTAssertEqual(a.status, 405)
            XCTAssertEqual(a.header("Allow"), "DELETE, GET, HEAD, PATCH")
            XCTAssertNil(a.header("Access-Control-Allow-Origin"))
            XCTAssertEqual(a.header("Vary"), "Origin")
        }
        // Without Access-Control-Request-Method an OPTIONS is no preflight: 405, readable by an allowed origin.
        let plain = try XCTUnwrap(preflight(h, "/v1/me/notifications/n1", origin: Self.page, method: nil).response)
        XCTAssertEqual(plain.status, 405)
        XCTAssertEqual(plain.header("Access-Control-Allow-Origin"), Self.page)
        XCTAssertEqual(preflight(h, "/v1/nowhere", origin: Self.page).response?.status, 404)
        // An app with no list acts (a page of the gateway's own origin sends it too), unread by other origins.
        let counts = try XCTUnwrap(h.request("GET", "/v1/me/counts", token: h.token("u", app: Self.other),
                                             headers: ["origin": "https://evil.example"]).settled(h).response)
        XCTAssertEqual(counts.status, 200)
        XCTAssertNil(counts.header("Access-Control-Allow-Origin"))
    }

    /// The app whose credentials the request carries decides; a request that
    /// proves none is let read by any allowed origin, so it learns nothing of apps.
    func testAnswersCarryTheHeadersOfTheAppTheCredentialsProve() {
        let h = harness([Self.listed, Self.other, Self.open])
        func acao(_ method: String, _ path: String, token: String, origin: String = Self.page) -> String? {
            h.request(method, path, token: token, headers: ["origin": origin]).settled(h).response?.header("Access-Control-Allow-Origin")
        }
        XCTAssertEqual(acao("GET", "/v1/me/counts", token: h.token("u", app: Self.listed)), Self.page)
        XCTAssertEqual(acao("GET", "/v1/me/counts", token: h.token("u", app: Self.listed), origin: "http://localhost:5173"),
                       "http://localhost:5173")
        XCTAssertNil(acao("GET", "/v1/me/counts", token: h.token("u", app: Self.other)), "its app allows no origin")
        XCTAssertNil(acao("GET", "/v1/me/counts", token: h.token("u", app: Self.listed), origin: "https://evil.example"))
        XCTAssertEqual(acao("GET", "/v1/me/counts", token: h.token("u", app: Self.open), origin: "https://any.example"),
                       "https://any.example", "* echoes the origin")
        XCTAssertEqual(acao("GET", "/v1/apps/listed/users/u/devices", token: "sk-l"), Self.page)
        XCTAssertNil(acao("GET", "/v1/apps/other/users/u/devices", token: "sk-o"))
        // Refused credentials prove no app: the 401 is readable, so a page can renew its token.
        XCTAssertEqual(acao("GET", "/v1/me/counts", token: "forged"), Self.page)
        XCTAssertEqual(acao("GET", "/v1/apps/other/users/u/devices", token: "sk-l"), Self.page)
        XCTAssertEqual(acao("GET", "/healthz", token: "none"), Self.page)
        // A route that takes no credential proves no app, whatever the request carries.
        XCTAssertEqual(acao("GET", "/healthz", token: h.token("u", app: Self.other)), Self.page)
        XCTAssertEqual(h.request("GET", "/healthz", token: h.token("u", app: Self.listed), headers: ["origin": "https://evil.example"])
            .settled(h).response?.status, 200)
    }

    /// An app that lists origins refuses requests from others before doing
    /// anything, even when another app's `*` let their preflight through.
    func testAnAppWithAListRefusesRequestsFromOtherOrigins() throws {
        let h = harness([Self.listed, Self.open])
        let published = h.request("POST", "/v1/apps/listed/users/u/notifications", token: "sk-l",
                                  body: ["appNotificationId": "a", "payload": ["title": "t"]]).settled(h)
        let id = try XCTUnwrap(published.json?["notification"]?.objectValue?["id"]?.stringValue)
        let evil = "https://evil.example"
        XCTAssertEqual(preflight(h, "/v1/me/notifications/\(id)", origin: evil).response?.status, 204, "open allows *")
        for r in [h.request("PATCH", "/v1/me/notifications/\(id)", token: h.token("u", app: Self.listed),
                            body: ["userActionState": "dismissed"], headers: ["origin": evil]),
                  h.request("DELETE", "/v1/apps/listed/users/u/notifications/\(id)", token: "sk-l", headers: ["origin": evil])] {
            let a = try XCTUnwrap(r.settled(h).response)
            XCTAssertEqual(a.status, 403)
            XCTAssertEqual(r.json?["error"]?.objectValue?["code"], "forbidden")
            XCTAssertNil(a.header("Access-Control-Allow-Origin"))
        }
        let now = h.request("GET", "/v1/apps/listed/users/u/notifications/\(id)", token: "sk-l").settled(h)
        XCTAssertEqual(now.json?["notification"]?.objectValue?["version"], 1, "nothing changed")
        // Without an Origin (not a browser) and from a listed one it acts.
        XCTAssertEqual(h.request("PATCH", "/v1/me/notifications/\(id)", token: h.token("u", app: Self.listed),
                                 body: ["readState": "read"]).settled(h).response?.status, 200)
        XCTAssertEqual(h.request("PATCH", "/v1/me/notifications/\(id)", token: h.token("u", app: Self.listed),
                                 body: ["readState": "unread"], headers: ["origin": Self.page]).settled(h).response?.status, 200)
    }

    /// Every route of the route table (`Route.Path.all`, so also one added
    /// later), with valid credentials of an app that lists origins, from an
    /// origin it does not list: 403 before anything happens. A route proves
    /// its app with the credential it takes (`Route.credential`); a route
    /// that answers without credentials proves no app and is skipped,
    /// and those are named, so that a new route cannot slip out that way.
    func testEveryRouteOfTheTableRefusesAnOriginItsAppDoesNotList() throws {
        let h = harness([Self.listed, Self.open])
        var refused: [String] = [], open: Set<String> = []
        for p in Route.Path.all where !p.demoOnly {
            let path = "/" + p.pattern.replacing("{app}", with: Self.listed.id).replacing(/\{[a-zA-Z]+\}/, with: "x1")
            for route in p.routes {
                let method = route.method
                let credential = route.credential == .serverKey ? "sk-l" : h.token("u", app: Self.listed)
                guard h.request(method, path, token: "none").settled(h).response?.status == 401 else {
                    open.insert("\(method) \(p.pattern)")
                    continue
                }
                let r = h.request(method, path, token: credential, body: [:], headers: ["origin": "https://evil.example"]).settled(h)
                let a = try XCTUnwrap(r.response, "\(method) \(path)")
                XCTAssertEqual(a.status, 403, "\(method) \(path)")
                XCTAssertEqual(r.json?["error"]?.objectValue?["message"]?.stringValue, Gateway.originRefused.message, "\(method) \(path)")
                refused.append("\(method) \(p.pattern)")
            }
        }
        XCTAssertEqual(open, ["GET healthz", "GET metrics", "GET v1/ws", "GET admin", "GET admin/{file}"],
                       "the routes that take no credentials (the admin page's files hold no app's data)")
        for route in ["GET v1/apps/{app}/inspect", "GET v1/apps/{app}/users/{user}/inspect",
                      "PUT v1/apps/{app}/users/{user}/devices/{deviceId}", "DELETE v1/apps/{app}/users/{user}/devices/{deviceId}",
                      "POST v1/apps/{app}/users/{user}/notifications", "PATCH v1/me/notifications/{id}"] {
            XCTAssertTrue(refused.contains(route), "\(route) was walked: \(refused)")
        }
        XCTAssertEqual(h.request("GET", "/v1/apps/listed/users/u/devices", token: "sk-l").settled(h).json?["devices"], [],
                       "nothing was registered")
    }

    /// `?token=` (EventSource) proves the app too; streamed and held answers carry the headers.
    func testEventStreamAndLongPollAnswersCarryTheHeaders() {
        let h = harness()
        let t = h.token("u", app: Self.listed)
        let events = h.request("GET", "/v1/me/events", token: "", query: [("token", t)], headers: ["origin": Self.page])
        let poll = h.request("GET", "/v1/me/sync", token: "", query: [("token", t), ("cursor", "0"), ("wait", "30")],
                             headers: ["origin": Self.page])
        h.settle()
        XCTAssertTrue(events.streamStarted)
        XCTAssertTrue(events.streamHeaders.contains { $0 == ("Access-Control-Allow-Origin", Self.page) })
        XCTAssertTrue(events.streamHeaders.contains { $0 == ("Access-Control-Expose-Headers", "Retry-After") })
        XCTAssertNil(poll.response, "held")
        _ = h.request("POST", "/v1/apps/listed/users/u/notifications", token: "sk-l",
                  body: ["appNotificationId": "a", "payload": ["title": "t"]])
        h.settle()
        XCTAssertEqual(poll.json?["changes"]?.arrayValue?.count, 1)
        XCTAssertEqual(poll.response?.header("Access-Control-Allow-Origin"), Self.page)
    }

    func testWithoutAllowedOriginsAnswersAreAsBefore() throws {
        let h = harness([Self.other])
        let r = try XCTUnwrap(preflight(h, "/v1/me/notifications/n1", origin: Self.page).response)
        XCTAssertEqual(r.status, 405)
        XCTAssertTrue(r.headers.allSatisfy { $0.0 == "Allow" }, "\(r.headers)")
    }

    /// The same at hello: an app with a list takes WebSockets from its
    /// origins and from clients that send none; an app without one takes any.
    func testWebSocketHelloChecksTheOriginAgainstTheTokensApp() {
        let h = harness()
        for (origin, app, welcomed) in [(Self.page, Self.listed, true), (nil, Self.listed, true),
                                        ("https://evil.example", Self.listed, false), ("https://evil.example", Self.other, true)] {
            let s = h.webSocket(origin: origin)
            h.hello(s, user: "u", app: app)
            h.settle(); s.read()
            if welcomed {
                XCTAssertEqual(s.types.last, "welcome", "\(String(describing: origin)) for \(app.id)")
            } else {
                XCTAssertEqual(s.session.closeRequest?.code, .forbiddenDevice)
                XCTAssertEqual(s.frames.last?["code"], "forbidden")
            }
        }
    }

    func testOriginsAreWrittenAsBrowsersSendThem() {
        for good in ["https://app.example.com", "http://localhost:5173", "http://127.0.0.1:8080", "http://[::1]:3000",
                     "capacitor://localhost", "https://xn--bcher-kva.example", "http://a.example:65535"] {
            XCTAssertTrue(CORS.isOrigin(good), good)
        }
        for bad in ["", "*", "null", "app.example.com", "https://app.example.com/", "https://app.example.com/path",
                    "https://App.example.com", "HTTPS://app.example.com", "https://app.example.com:443", "http://a.example:80",
                    "http://a.example:0", "http://a.example:65536", "http://a.example:080", "https://user@app.example.com",
                    "https://app.example.com?x", "https://", "https://a..b", "https://a.example:"] {
            XCTAssertFalse(CORS.isOrigin(bad), bad)
        }
    }
}

extension HTTPResponse {
    func header(_ name: String) -> String? { headers.first { $0.0 == name }?.1 }
}

extension RecordingResponder {
    func settled(_ h: Harness) -> RecordingResponder {
        h.settle()
        return self
    }
}
