/// Reads a JSON request object field by field, refusing unknown keys and
/// wrong types with messages that name the field. `null` counts as absent
/// for optional fields.
public struct Fields {
    public let object: JSONObject
    /// The length of the JSON text read, when read from bytes.
    public let textLength: Int?
    /// Which of `object`'s keys a reader asked for, by position.
    private var seen: [Bool]

    public init(_ json: JSON, what: String = "body") throws(HeraldError) {
        try self.init(json, what: what, textLength: nil)
    }

    private init(_ json: JSON, what: String, textLength: Int?) throws(HeraldError) {
        guard let o = json.objectValue else { throw .badRequest("\(what) must be a JSON object") }
        object = o
        self.textLength = textLength
        seen = Array(repeating: false, count: o.count)
    }

    public init(bytes: [UInt8], what: String = "body") throws(HeraldError) {
        let json: JSON
        do { json = try JSONParser.parse(bytes) } catch { throw .badRequest(error.message) }
        try self.init(json, what: what, textLength: bytes.count)
    }

    public func has(_ key: String) -> Bool { object[key].map { !$0.isNull } ?? false }

    mutating func raw(_ key: String) -> JSON? {
        guard let i = object.keys.firstIndex(of: key) else { return nil }
        seen[i] = true
        let v = object.values[i]
        guard !v.isNull else { return nil }  // not `? nil :`, which makes a JSON null
        return v
    }

    public mutating func string(_ key: String, maxBytes: Int = 1024) throws(HeraldError) -> String? {
        guard let v = raw(key) else { return nil }
        guard let s = v.stringValue else { throw .badRequest("\(key) must be a string") }
        guard s.utf8.count <= maxBytes else { throw .badRequest("\(key) is longer than \(maxBytes) bytes") }
        return s
    }

    public mutating func requiredString(_ key: String, maxBytes: Int = 1024) throws(HeraldError) -> String {
        guard let s = try string(key, maxBytes: maxBytes) else { throw .badRequest("\(key) is required") }
        return s
    }

    public mutating func id(_ key: String, required: Bool = false) throws(HeraldError) -> String? {
        guard let s = try string(key, maxBytes: 128) else {
            if required { throw .badRequest("\(key) is required") }
            return nil
        }
        guard Identifiers.isUserId(s) else {
            throw .badRequest("\(key) must be 1-128 characters of A-Z a-z 0-9 . _ @ : -")
        }
        return s
    }

    public mutating func int(_ key: String, in range: ClosedRange<Int64>) throws(HeraldError) -> Int64? {
        guard let v = raw(key) else { return nil }
        guard let i = v.int64Value else { throw .badRequest("\(key) must be an integer") }
        guard range.contains(i) else { throw .badRequest("\(key) must be between \(range.lowerBound) and \(range.upperBound)") }
        return i
    }

    /// An RFC 3339 time, in milliseconds.
    public mutating func time(_ key: String) throws(HeraldError) -> Millis? {
        guard let s = try string(key, maxBytes: 64) else { return nil }
        guard let ms = RFC3339.parse(s) else { throw .badRequest("\(key) must be an RFC 3339 time") }
        return ms
    }

    public mutating func enumValue<E: RawRepresentable & CaseIterable>(_ key: String, _: E.Type) throws(HeraldError) -> E?
    where E.RawValue == String {
        guard let s = try string(key, maxBytes: 64) else { return nil }
        guard let e = E(rawValue: s) else {
            throw .badRequest("\(key) must be one of \(E.allCases.map { $0.rawValue }.joined(separator: ", "))")
        }
        return e
    }

    public mutating func array(_ key: String) throws(HeraldError) -> [JSON]? {
        guard let v = raw(key) else { return nil }
        guard let a = v.arrayValue else { throw .badRequest("\(key) must be an array") }
        return a
    }

    public mutating func object(_ key: String) throws(HeraldError) -> JSONObject? {
        guard let v = raw(key) else { return nil }
        guard let o = v.objectValue else { throw .badRequest("\(key) must be a JSON object") }
        return o
    }

    /// Call last: refuses keys no reader asked for.
    public func finish() throws(HeraldError) {
        if let i = seen.firstIndex(of: false) {
            throw .badRequest("unknown field \"\(object.keys[i].prefix(64))\"")
        }
    }
}
