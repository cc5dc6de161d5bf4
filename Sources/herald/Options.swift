import Foundation
import HeraldCore
import HeraldGateway
import HeraldPorts

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

/// `herald.json`: `{"apps": [...], "host", "port", "store", "bus", "limits", "tlsCert", "tlsKey"}`;
/// an app is `{"id", "serverKey" or "serverKeys", "tokenSecret" or "tokenSecrets", "allowedOrigins"?, "push"?, "criticalGroups"?, "webhooks"?}`
/// (docs/OPERATIONS.md).
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
                let app: AppConfig
                do { app = try Self.app(e) } catch { throw UsageError("config file \(path): apps[\(i)]: \(error.message)") }
                guard !apps.contains(where: { $0.id == app.id }) else { throw UsageError("config file \(path): app '\(app.id)' appears twice") }
                apps.append(app)
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
        ("maxDevicesPerUser", \.maxDevicesPerUser),
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

    /// One app of the file. Each credential comes in one of two forms: a
    /// string (`serverKey`, `tokenSecret`), or a list, newest first, for
    /// rotating (`serverKeys`; `tokenSecrets` of `{"kid", "secret"}`).
    static func app(_ json: JSON) throws(UsageError) -> AppConfig {
        guard let o = json.objectValue else { throw UsageError("an app must be an object") }
        for k in o.keys where !["id", "serverKey", "serverKeys", "tokenSecret", "tokenSecrets", "allowedOrigins", "push", "criticalGroups",
                                "webhooks"].contains(k) {
            throw UsageError("unknown key \"\(k)\"")
        }
        guard let id = o["id"]?.stringValue else { throw UsageError("needs an id string") }
        /// `one`'s string, or nil when the list `many` is there instead.
        func single(_ one: String, or many: String) throws(UsageError) -> String? {
            switch (o[one], o[many]) {
            case (let v?, nil):
                guard let s = v.stringValue else { throw UsageError("app \(id): \(one) must be a string") }
                return s
            case (nil, let v?):
                guard let list = v.arrayValue, !list.isEmpty else { throw UsageError("app \(id): \(many) must be a non-empty list") }
                return nil
            default: throw UsageError("app \(id) needs exactly one of \(one) and \(many)")
            }
        }
        var keys: [String] = []
        if let key = try single("serverKey", or: "serverKeys") { keys = [key] } else {
            for v in o["serverKeys"]!.arrayValue! {
                guard let k = v.stringValue else { throw UsageError("app \(id): serverKeys must be strings") }
                keys.append(k)
            }
        }
        var secrets: [TokenSecret] = []
        if let secret = try single("tokenSecret", or: "tokenSecrets") { secrets = [TokenSecret(secret: secret)] } else {
            for v in o["tokenSecrets"]!.arrayValue! {
                guard let e = v.objectValue, e.count == 2, let kid = e["kid"]?.stringValue, let secret = e["secret"]?.stringValue else {
                    throw UsageError("app \(id): each of tokenSecrets must be exactly {\"kid\": string, \"secret\": string}")
                }
                guard Identifiers.isKeyId(kid) else { throw UsageError("app \(id): kid '\(kid)' must be 1-64 characters of A-Z a-z 0-9 . _ -") }
                guard !secrets.contains(where: { $0.kid == kid }) else { throw UsageError("app \(id): kid '\(kid)' appears twice") }
                secrets.append(TokenSecret(kid: kid, secret: secret))
            }
        }
        var origins: [String] = []
        if let v = o["allowedOrigins"] {
            guard let list = v.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
                throw UsageError("app \(id): allowedOrigins must be an array of strings")
            }
            origins = list.map { $0.stringValue! }
        }
        var critical: [String] = []
        if let v = o["criticalGroups"] {
            // As a publish's groupName, so that every critical group can be published to.
            guard let list = v.arrayValue, list.allSatisfy({ $0.stringValue.map(Preferences.isGroupName) ?? false }) else {
                throw UsageError("app \(id): criticalGroups must be an array of group names (1-\(Limits.maxGroupNameBytes) bytes each)")
            }
            critical = list.map { $0.stringValue! }
        }
        let push = try o["push"].map { v throws(UsageError) in try Self.push(v, app: id) }
        let webhooks = try o["webhooks"].map { v throws(UsageError) in try Self.webhooks(v, app: id) } ?? []
        return try app(id: id, serverKeys: keys, tokenSecrets: secrets, origins: origins, push: push, criticalGroups: critical,
                       webhooks: webhooks)
    }

    /// The checks every app passes, from the file or from flags.
    static func app(id: String, serverKeys: [String], tokenSecrets: [TokenSecret], origins: [String],
                    push: PushSettings? = nil, criticalGroups: [String] = [], webhooks: [WebhookEndpoint] = []) throws(UsageError) -> AppConfig {
        guard Identifiers.isAppId(id) else { throw UsageError("app id '\(id)' must be 1-64 characters of A-Z a-z 0-9 . _ -") }
        guard !serverKeys.contains(""), !tokenSecrets.contains(where: { $0.secret.isEmpty }) else {
            throw UsageError("app \(id): server keys and token secrets must not be empty")
        }
        // Never quoted: keys and secrets stay out of error lines.
        guard Set(serverKeys).count == serverKeys.count else { throw UsageError("app \(id): the same server key is listed twice") }
        guard Set(tokenSecrets.map(\.secret)).count == tokenSecrets.count else {
            throw UsageError("app \(id): the same token secret is listed twice")
        }
        // Compared byte for byte with what browsers send, so only that form can ever match.
        for o in origins where o != "*" && !CORS.isOrigin(o) {
            throw UsageError("app \(id): allowed origin '\(o)' must be * or scheme://host[:port] as browsers send it"
                             + " (lower case, no path or trailing slash, no default port)")
        }
        return AppConfig(id: id, serverKeys: serverKeys, tokenSecrets: tokenSecrets, allowedOrigins: origins, push: push,
                         criticalGroups: criticalGroups, webhooks: webhooks)
    }
}

/// What `serve` takes from its config file and flags, flags winning: read
/// at start and again at each reload.
struct Settings {
    var apps: [AppConfig]
    var host: String
    var port: Int
    var store: String
    var bus: String?
    var limits: GatewayLimits
    var tlsCert: String?
    var tlsKey: String?

    /// A worker's store and bus are its supervisor's, whatever the config
    /// file says when the worker (re)starts or reloads.
    init(_ f: Flags, worker: WorkerRole? = nil) throws(UsageError) {
        var file = ConfigFile()
        if let path = f["config"] { file = try ConfigFile(path: path) }
        apps = file.apps
        let single = [f["app"], f["server-key"], f["token-secret"]]
        if single.contains(where: { $0 != nil }) {
            guard let id = single[0], let key = single[1], let secret = single[2] else {
                throw UsageError("--app, --server-key and --token-secret go together")
            }
            // Origins hold no commas, so one comma-separated value lists them all.
            let origins = f["allowed-origins"].map { $0.split(separator: ",", omittingEmptySubsequences: false).map { String($0.trimmingSpaces) } }
            apps.removeAll { $0.id == id }
            apps.append(try ConfigFile.app(id: id, serverKeys: [key], tokenSecrets: [TokenSecret(secret: secret)], origins: origins ?? []))
        } else if f["allowed-origins"] != nil {
            throw UsageError("--allowed-origins goes with --app")
        }
        guard !apps.isEmpty || f.switches.contains("demo") else { throw UsageError("no app configured: give --config, --app ... or --demo") }
        host = f["host"] ?? file.host ?? "127.0.0.1"
        guard host.split(separator: ".").count == 4, inet_addr(host) != INADDR_NONE || host == "255.255.255.255" else {
            throw UsageError("--host must be an IPv4 address such as 127.0.0.1")
        }
        port = try f.int("port", in: 0...65535) ?? file.port ?? 8080
        store = f["store"] ?? file.store ?? "sqlite:herald.db"
        bus = f["bus"] ?? file.bus
        if let worker { store = worker.store; bus = worker.bus }
        limits = file.limits
        tlsCert = f["tls-cert"] ?? file.tlsCert
        tlsKey = f["tls-key"] ?? file.tlsKey
    }
}
