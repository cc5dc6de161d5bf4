import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HeraldClient
import HeraldCore
import HeraldCrypto
import XCTest

/// A real `herald serve` process on a free port (memory store unless told),
/// with one app, driven over its server API with URLSession. Sendable so a
/// concurrent task can drive the server API (which reads only `baseURL`)
/// while the test stops or crashes the process.
final class GatewayProcess: @unchecked Sendable {
    static let app = "client-tests"
    static let serverKey = "sk-client-tests"
    static let tokenSecret = "secret-client-tests-0123456789abcdef"

    let baseURL: String
    let port: Int
    private let process = Process()
    private let log: URL

    /// The binary `swift build` makes (`HERALD_BIN` overrides).
    static var binary: URL {
        if let path = ProcessInfo.processInfo.environment["HERALD_BIN"] { return URL(fileURLWithPath: path) }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug/herald")
    }

    /// `port` 0 picks a free one; a restart passes the port it had.
    /// `config`: a config file holding the app (with its push settings,
    /// say) instead of the app's flags.
    init(store: String = "memory", port: Int = 0, arguments: [String] = [], config: String? = nil) throws {
        log = FileManager.default.temporaryDirectory.appendingPathComponent("herald-\(UUID().uuidString).log")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        process.executableURL = Self.binary
        let app = config.map { ["--config", $0] }
            ?? ["--app", Self.app, "--server-key", Self.serverKey, "--token-secret", Self.tokenSecret]
        process.arguments = ["serve", "--port", String(port), "--store", store] + app + arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardError = try FileHandle(forWritingTo: log)
        try process.run()
        // The one stdout line, once it accepts connections: `listening on http://HOST:PORT`.
        let text = Self.firstLine(of: out)
        guard text.hasPrefix("listening on ") else {
            kill(process.processIdentifier, SIGTERM)
            process.waitUntilExit()
            throw GatewayFailure("herald did not start (\(text)): \((try? String(contentsOf: log, encoding: .utf8)) ?? "")")
        }
        baseURL = String(text.dropFirst("listening on ".count))
        self.port = Int(baseURL.split(separator: ":").last!)!
    }

    /// The first line a process writes to `pipe` (empty if it ended first).
    static func firstLine(of pipe: Pipe) -> String {
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = pipe.fileHandleForReading.availableData
            if chunk.isEmpty { break }  // the process ended
            line.append(chunk)
        }
        return String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// SIGTERM, then waits for the exit.
    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
        try? FileManager.default.removeItem(at: log)
    }

    /// SIGKILL: no shutdown, nothing flushed but what the store committed.
    func crash() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        try? FileManager.default.removeItem(at: log)
    }

    deinit { stop() }

    /// A device token from `herald token` (no HTTP: works whatever the gateway's certificate).
    static func mintToken(user: String) throws -> String {
        let p = Process()
        p.executableURL = binary
        p.arguments = ["token", "--app", app, "--user", user, "--token-secret", tokenSecret]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A device token that expires at `exp` (seconds since 1970): sooner
    /// than the 60 s the token API and `herald token` allow.
    static func mintToken(user: String, exp: Int64) -> String {
        let claims = DeviceClaims(app: app, user: user, device: nil, issuedAt: exp - 60, expiresAt: exp)
        return DeviceToken.sign(claims, secret: tokenSecret)
    }

    // MARK: Server API

    func token(user: String) async throws -> String {
        let answer = try await call("POST", "/v1/apps/\(Self.app)/tokens", ["userId": user, "ttlSeconds": 3600])
        return try XCTUnwrap(answer["token"] as? String)
    }

    /// Publishes (or replaces) a notification; answers its id.
    @discardableResult
    func publish(user: String, appNotificationId: String, title: String) async throws -> String {
        try await publishing(user: user, appNotificationId: appNotificationId, title: title).id
    }

    /// Publishes (or replaces) a notification; answers its id and the feed's `seq` after it.
    func publishing(user: String, appNotificationId: String, title: String) async throws -> (id: String, seq: Int64) {
        let answer = try await call("POST", "/v1/apps/\(Self.app)/users/\(user)/notifications",
                                    ["appNotificationId": appNotificationId, "payload": ["title": title]])
        let n = try XCTUnwrap(answer["notification"] as? [String: Any])
        return (try XCTUnwrap(n["id"] as? String), try XCTUnwrap(answer["seq"] as? NSNumber).int64Value)
    }

    func dismiss(user: String, id: String) async throws {
        _ = try await call("PATCH", "/v1/apps/\(Self.app)/users/\(user)/notifications/\(id)",
                           ["userActionState": "dismissed"])
    }

    /// The user's registered devices as the server lists them, by device id.
    func devices(user: String) async throws -> [String: [String: Any]] {
        let answer = try await call("GET", "/v1/apps/\(Self.app)/users/\(user)/devices", nil)
        let list = try XCTUnwrap(answer["devices"] as? [[String: Any]])
        return Dictionary(uniqueKeysWithValues: list.map { ($0["deviceId"] as! String, $0) })
    }

    func delete(user: String, id: String) async throws {
        _ = try await call("DELETE", "/v1/apps/\(Self.app)/users/\(user)/notifications/\(id)", nil)
    }

    /// The user's live notifications as the server has them, every page:
    /// id → (version, readState, userActionState).
    func notifications(user: String) async throws -> [String: Snapshot] {
        var out: [String: Snapshot] = [:]
        var before: String?
        repeat {
            let page = before.map { "&before=\($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)" } ?? ""
            let answer = try await call("GET", "/v1/apps/\(Self.app)/users/\(user)/notifications?limit=100\(page)", nil)
            for n in try XCTUnwrap(answer["notifications"] as? [[String: Any]]) {
                out[n["id"] as! String] = Snapshot(version: (n["version"] as! NSNumber).int64Value,
                                                   readState: n["readState"] as! String,
                                                   userActionState: n["userActionState"] as! String)
            }
            before = answer["next"] as? String
        } while before != nil
        return out
    }

    private func call(_ method: String, _ path: String, _ body: [String: Any]?) async throws -> [String: Any] {
        var request = URLRequest(url: URL(string: baseURL + path)!, timeoutInterval: 10)
        request.httpMethod = method
        request.setValue("Bearer \(Self.serverKey)", forHTTPHeaderField: "Authorization")
        if let body {
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = try JSONSerialization.data(withJSONObject: body)
        }
        let (data, response) = try await URLSession.shared.data(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard (200..<300).contains(status) else {
            throw GatewayFailure("\(method) \(path): \(status) \(String(decoding: data, as: UTF8.self))", status: status)
        }
        if data.isEmpty { return [:] }
        return try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any])
    }
}

struct Snapshot: Equatable {
    var version: Int64
    var readState: String
    var userActionState: String

    init(version: Int64, readState: String, userActionState: String) {
        self.version = version; self.readState = readState; self.userActionState = userActionState
    }

    init(_ n: HeraldNotification) {
        self.init(version: n.version, readState: n.readState.rawValue, userActionState: n.userActionState.rawValue)
    }
}

struct GatewayFailure: Error, CustomStringConvertible {
    let description: String
    /// The HTTP status of a refused server API call.
    var status: Int?
    init(_ description: String, status: Int? = nil) { self.description = description; self.status = status }
}
