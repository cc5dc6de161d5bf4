/// A binary min-heap.
public struct Heap<T: Comparable> {
    private var items: [T] = []
    public init() {}
    public var peek: T? { items.first }
    public var count: Int { items.count }

    public mutating func push(_ x: T) {
        items.append(x)
        var i = items.count - 1
        while i > 0 {
            let p = (i - 1) / 2
            guard items[i] < items[p] else { break }
            items.swapAt(i, p)
            i = p
        }
    }

    /// Drops every element `remove` says to (then restores the heap order).
    public mutating func removeAll(where remove: (T) -> Bool) {
        let kept = items.filter { !remove($0) }
        items = []
        for x in kept { push(x) }
    }

    public mutating func pop() -> T? {
        guard !items.isEmpty else { return nil }
        items.swapAt(0, items.count - 1)
        let top = items.removeLast()
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < items.count, items[l] < items[m] { m = l }
            if r < items.count, items[r] < items[m] { m = r }
            if m == i { break }
            items.swapAt(i, m)
            i = m
        }
        return top
    }
}
