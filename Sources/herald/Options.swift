import Foundation
import HeraldCore
import HeraldGateway

/// A command-line or configuration problem: one line on stderr, exit 2.
struct UsageError: Error { let message: String; init(_ m: String) { message = m } }

/// Flags as `--name value` pairs (and bare `--demo`), each known name once.
struct Flags {
    private var values: [String: String] = [:]
    private(set) var switches: Set<String> = []

    init(_ args: ArraySlice<String>, valued: Set<String>, switches allowed: Set<String>) throws(UsageError) {
        var i = args.startIndex
        while i < args.endIndex {
            let a = args[i]
            var name = a, inline: String? = nil
            if let eq = a.firstIndex(of: "="), a.hasPrefix("--") {
                name = String(a[..<eq]); inline = String(a[a.index(after: eq)...])
            }
            guard name.hasPrefix("--") else { throw UsageError("unexpected argument '\(a)'") }
            let key = String(name.dropFirst(2))
            if allowed.contains(key) {
                guard inline == nil else { throw UsageError("--\(key) takes no value") }
                switches.insert(key)
                i += 1
                continue
            }
            guard valued.contains(key) else { throw UsageError("unknown flag '\(name)'") }
            guard values[key] == nil else { throw UsageError("--\(key) given twice") }
            if let inline {
                values[key] = inline
                i += 1
            } else {
                guard i + 1 < args.endIndex, !args[i + 1].hasPrefix("--") else { throw UsageError("--\(key) needs a value") }
                values[key] = args[i + 1]
                i += 2
            }
        }
    }

    subscript(_ key: String) -> String? { values[key] }

    func int(_ key: String, in range: ClosedRange<Int>) throws(UsageError) -> Int? {
        guard let s = values[key] else { return nil }
        guard let v = Int(s), range.contains(v) else {
            throw UsageError("--\(key) must be a whole number from \(range.lowerBound) to \(range.upperBound)")
        }
        return v
    }
}

/// `herald.json`: `{"apps": [{"id", "serverKey", "tokenSecret", "allowedOrigins"?}], "host", "port", "store", "bus",
/// "tlsCert", "tlsKey"}`.
struct ConfigFile {
    var apps: [AppConfig] = []
    var host: String?
    var port: Int?
    var store: String?
    var bus: String?
    var tlsCert: String?
    var tlsKey: String?
    var limits = GatewayLimits()

    init() {}

    init(path: String) throws(UsageError) {
        guard let data = FileManager.default.contents(atPath: path) else { throw UsageError("cannot read config file \(path)") }
        let json: JSON
        do { json = try JSONParser.parse(Array(data)) } catch { throw UsageError("config file \(path): \(error.message)") }
        guard let o = json.objectValue else { throw UsageError("config file \(path): must be a JSON object") }
        for k in o.keys where !["apps", "host", "port", "store", "bus", "limits", "tlsCert", "tlsKey"].contains(k) {
            throw UsageError("config file \(path): unknown key \"\(k)\"")
        }
        if let a = o["apps"] {
            guard let arr = a.arrayValue else { throw UsageError("config file \(path): apps must be an array") }
            for (i, e) in arr.enumerated() {
                guard let app = e.objectValue, let id = app["id"]?.stringValue, let key = app["serverKey"]?.stringValue,
                      let secret = app["tokenSecret"]?.stringValue, app.keys.allSatisfy(["id", "serverKey", "tokenSecret", "allowedOrigins"].contains)
                else { throw UsageError("config file \(path): apps[\(i)] needs id, serverKey and tokenSecret strings (and may have allowedOrigins), nothing else") }
                guard !apps.contains(where: { $0.id == id }) else { throw UsageError("config file \(path): app '\(id)' appears twice") }
                var origins: [String] = []
                if let v = app["allowedOrigins"] {
                    guard let list = v.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
                        throw UsageError("config file \(path): apps[\(i)].allowedOrigins must be an array of strings")
                    }
                    origins = list.map { $0.stringValue! }
                }
                apps.append(try Self.app(id: id, key: key, secret: secret, origins: origins))
            }
        }
        func string(_ k: String) throws(UsageError) -> String? {
            guard let v = o[k] else { return nil }
            guard let s = v.stringValue else { throw UsageError("config file \(path): \(k) must be a string") }
            return s
        }
        host = try string("host")
        store = try string("store")
        bus = try string("bus")
        tlsCert = try string("tlsCert")
        tlsKey = try string("tlsKey")
        if let l = o["limits"] {
            guard let lo = l.objectValue else { throw UsageError("config file \(path): limits must be an object") }
            limits = try Self.limits(lo, path: path)
        }
        if let p = o["port"] {
            guard let v = p.int64Value, (0...65535).contains(v) else { throw UsageError("config file \(path): port must be 0 to 65535") }
            port = Int(v)
        }
    }

    /// The tunable limits (docs/OPERATIONS.md), each a positive integer.
    nonisolated(unsafe) static let limitKeys: [(String, WritableKeyPath<GatewayLimits, Int>)] = [
        ("maxConnections", \.maxConnections),
        ("maxConnectionsPerUser", \.maxConnectionsPerUser),
        ("messagesPerSecondPerConnection", \.messagesPerSecondPerConnection),
        ("publishesPerSecondPerApp", \.publishesPerSecondPerApp),
        ("maxHeldPolls", \.maxHeldPolls),
        ("maxQueuedBytesPerConnection", \.maxQueuedBytesPerConnection),
        ("maxBodyBytes", \.maxBodyBytes),
        ("pingIntervalSeconds", \.pingIntervalSeconds),
        ("idleHangupSeconds", \.idleHangupSeconds),
        ("requestTimeoutSeconds", \.requestTimeoutSeconds),
        ("writeTimeoutSeconds", \.writeTimeoutSeconds),
    ]
    nonisolated(unsafe) static let limitSecondsKeys: [(String, WritableKeyPath<GatewayLimits, Int64>)] = [
        ("helloTimeoutSeconds", \.helloTimeoutSeconds),
        ("changeRetentionSeconds", \.changeRetentionSeconds),
        ("deviceLapseSeconds", \.deviceLapseSeconds),
    ]

    static func limits(_ o: JSONObject, path: String) throws(UsageError) -> GatewayLimits {
        var l = GatewayLimits()
        for (k, v) in o.pairs {
            guard let n = v.int64Value, n >= 1, n <= Int64(Int32.max) else {
                throw UsageError("config file \(path): limits.\(k) must be a whole number from 1 to \(Int32.max)")
            }
            if let kp = limitKeys.first(where: { $0.0 == k })?.1 {
                l[keyPath: kp] = Int(n)
            } else if let kp = limitSecondsKeys.first(where: { $0.0 == k })?.1 {
                l[keyPath: kp] = n
            } else {
                throw UsageError("config file \(path): unknown limit \"\(k)\"")
            }
        }
        return l
    }

    static func app(id: String, key: String, secret: String, origins: [String]) throws(UsageError) -> AppConfig {
        guard Identifiers.isAppId(id) else { throw UsageError("app id '\(id)' must be 1-64 characters of A-Z a-z 0-9 . _ -") }
        guard !key.isEmpty, !secret.isEmpty else { throw UsageError("app \(id): serverKey and tokenSecret must not be empty") }
        // Compared byte for byte with what browsers send, so only that form can ever match.
        for o in origins where o != "*" && !CORS.isOrigin(o) {
            throw UsageError("app \(id): allowed origin '\(o)' must be * or scheme://host[:port] as browsers send it"
                             + " (lower case, no path or trailing slash, no default port)")
        }
        return AppConfig(id: id, serverKey: key, tokenSecret: secret, allowedOrigins: origins)
    }
}
