/// splitmix64: tiny, fast, and the same on every platform and Swift version
/// (unlike the standard library's `random(in:using:)` algorithms).
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// 0..<n (n > 0).
    public mutating func below(_ n: Int) -> Int { n <= 1 ? 0 : Int(next() % UInt64(n)) }
    /// lo...hi
    public mutating func range(_ lo: Int, _ hi: Int) -> Int { lo + below(hi - lo + 1) }
    /// true one time in `n`.
    public mutating func oneIn(_ n: Int) -> Bool { below(n) == 0 }
    public mutating func pick<T>(_ a: [T]) -> T { a[below(a.count)] }
    public mutating func byte() -> UInt8 { UInt8(truncatingIfNeeded: next()) }
    /// Small numbers most of the time, sometimes large: 1, 2, 4 ... up to `max`.
    public mutating func powerLaw(_ max: Int) -> Int {
        var n = 1
        while n < max, oneIn(2) { n *= 2 }
        return range(1, Swift.max(1, n))
    }
}
