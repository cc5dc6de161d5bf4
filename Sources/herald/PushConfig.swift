import HeraldCore
import HeraldGateway
import HeraldPorts
import HeraldPush

/// An app's `push` object in the config file (docs/OPERATIONS.md, "Push"):
/// `{"alert"?: {"title", "body"}, "apns"?: {...}, "fcm"?: {...}, "webpush"?: {...}}`.
/// Every key file is read here, so one that does not read or parse stops
/// the start (or the reload) with one line; its contents are never quoted.
extension ConfigFile {
    static func push(_ json: JSON, app id: String) throws(UsageError) -> PushSettings {
        var f = try Section(json, "app \(id): push")
        var settings = PushSettings()
        if let a = try f.object("alert") {
            var alert = try Section(.object(a), "app \(id): push.alert")
            let title = try alert.required("title"), body = try alert.required("body")
            try alert.finish()
            guard AlertPointers.isPointer(title), AlertPointers.isPointer(body) else {
                throw UsageError("app \(id): push.alert's title and body must be JSON pointers into the payload, such as \"/title\"")
            }
            settings.alert = AlertPointers(title: title, body: body)
        }
        if let o = try f.object("apns") {
            var a = try Section(.object(o), "app \(id): push.apns")
            var apns = PushSettings.APNs(teamId: try a.required("teamId"), keyId: try a.required("keyId"),
                                         keyFile: try a.required("keyFile"), topic: try a.required("topic"))
            apns.developmentKeyId = try a.string("developmentKeyId")
            apns.developmentKeyFile = try a.string("developmentKeyFile")
            guard (apns.developmentKeyId == nil) == (apns.developmentKeyFile == nil) else {
                throw UsageError("app \(id): push.apns needs developmentKeyId and developmentKeyFile together")
            }
            if let e = try a.endpoint("endpoint") { apns.endpoint = e }
            if let e = try a.endpoint("developmentEndpoint") { apns.developmentEndpoint = e }
            apns.caFile = try a.string("caFile")
            try a.finish()
            settings.apns = apns
        }
        if let o = try f.object("fcm") {
            var a = try Section(.object(o), "app \(id): push.fcm")
            var fcm = PushSettings.FCM(serviceAccountFile: try a.required("serviceAccountFile"))
            if let e = try a.endpoint("endpoint") { fcm.endpoint = e }
            fcm.caFile = try a.string("caFile")
            try a.finish()
            settings.fcm = fcm
        }
        if let o = try f.object("webpush") {
            var a = try Section(.object(o), "app \(id): push.webpush")
            let subject = try a.required("subject")
            if let problem = PushSettings.WebPush.subjectProblem(subject) {
                throw UsageError("app \(id): push.webpush.subject \(problem)")
            }
            var web = PushSettings.WebPush(vapidPrivateKeyFile: try a.required("vapidPrivateKeyFile"), subject: subject, publicKey: "")
            if let hosts = try a.strings("allowedHosts") { web.allowedHosts = hosts.map { $0.lowercased() } }
            web.caFile = try a.string("caFile")
            try a.finish()
            settings.webPush = web
        }
        if let t = try f.int("tapIntervalSeconds", in: 0...3600) { settings.tapIntervalSeconds = t }
        if let p = try f.int("pingIntervalSeconds", in: 1...3600) { settings.pingIntervalSeconds = p }
        try f.finish()
        guard !settings.services.isEmpty else { throw UsageError("app \(id): push names no service (apns, fcm or webpush)") }
        do { try PushCredentials.check(&settings) } catch { throw UsageError("app \(id): \(error.description)") }
        return settings
    }

    /// One object of the config file, read key by key; unknown keys refused.
    struct Section {
        let o: JSONObject
        let what: String
        var seen: Set<String> = []

        init(_ json: JSON, _ what: String) throws(UsageError) {
            guard let o = json.objectValue else { throw UsageError("\(what) must be an object") }
            self.o = o; self.what = what
        }

        mutating func string(_ k: String) throws(UsageError) -> String? {
            seen.insert(k)
            guard let v = o[k] else { return nil }
            guard let s = v.stringValue, !s.isEmpty else { throw UsageError("\(what).\(k) must be a non-empty string") }
            return s
        }

        mutating func required(_ k: String) throws(UsageError) -> String {
            guard let s = try string(k) else { throw UsageError("\(what) needs \(k)") }
            return s
        }

        mutating func object(_ k: String) throws(UsageError) -> JSONObject? {
            seen.insert(k)
            guard let v = o[k] else { return nil }
            guard let obj = v.objectValue else { throw UsageError("\(what).\(k) must be an object") }
            return obj
        }

        mutating func strings(_ k: String) throws(UsageError) -> [String]? {
            seen.insert(k)
            guard let v = o[k] else { return nil }
            guard let list = v.arrayValue, list.allSatisfy({ !($0.stringValue ?? "").isEmpty }) else {
                throw UsageError("\(what).\(k) must be an array of non-empty strings")
            }
            return list.map { $0.stringValue! }
        }

        mutating func int(_ k: String, in range: ClosedRange<Int>) throws(UsageError) -> Int? {
            seen.insert(k)
            guard let v = o[k] else { return nil }
            guard let n = v.int64Value, range.contains(Int(n)) else {
                throw UsageError("\(what).\(k) must be a whole number from \(range.lowerBound) to \(range.upperBound)")
            }
            return Int(n)
        }

        /// A service's base URL: `https://host[:port]`, nothing after it.
        mutating func endpoint(_ k: String) throws(UsageError) -> String? {
            guard let s = try string(k) else { return nil }
            guard let origin = PushHandle.httpsOrigin(s)?.origin, origin == s.lowercased() else {
                throw UsageError("\(what).\(k) must be https://host[:port] with no path")
            }
            return s
        }

        func finish() throws(UsageError) {
            for k in o.keys where !seen.contains(k) { throw UsageError("\(what): unknown key \"\(k)\"") }
        }
    }
}
