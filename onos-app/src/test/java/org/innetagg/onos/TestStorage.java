package org.innetagg.onos;

import org.onosproject.store.service.AsyncDistributedLock;
import org.onosproject.store.service.ConsistentMap;
import org.onosproject.store.service.ConsistentMapAdapter;
import org.onosproject.store.service.ConsistentMapBuilder;
import org.onosproject.store.service.DistributedLockBuilder;
import org.onosproject.store.service.Serializer;
import org.onosproject.store.service.TestConsistentMap;
import org.onosproject.store.service.TestStorageService;
import org.onosproject.store.service.Version;
import org.onosproject.store.service.Versioned;

import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.stream.Collectors;

/**
 * ONOS's test storage as a cluster's store behaves for the app's maps: maps of one name are
 * one map whichever instance builds them, every call is atomic (TestConsistentMap's
 * {@code replace(key, version, value)} and {@code remove(key, version)} are a get then a
 * put; Atomix's are one operation), and every value written goes through the map's
 * serializer, so that a value class Kryo cannot carry fails here as it would in ONOS.
 */
public final class TestStorage extends TestStorageService {
    private final Map<String, ConsistentMap<?, ?>> maps = new HashMap<>();
    private final Map<String, TestLock> locks = new HashMap<>();

    /** One lock per name, whichever instance builds it, as the cluster's. */
    @Override
    public synchronized DistributedLockBuilder lockBuilder() {
        return new DistributedLockBuilder() {
            @Override
            public AsyncDistributedLock build() {
                synchronized (TestStorage.this) {
                    return locks.computeIfAbsent(name(), TestLock::new);
                }
            }
        };
    }

    /** Held by a thread here (by a node's session in Atomix); versions increase. */
    private static final class TestLock implements AsyncDistributedLock {
        private final String name;
        private final ReentrantLock lock = new ReentrantLock();
        private long version;

        TestLock(String name) {
            this.name = name;
        }

        @Override
        public String name() {
            return name;
        }

        private synchronized Version next() {
            return new Version(++version);
        }

        @Override
        public CompletableFuture<Version> lock() {
            lock.lock();
            return CompletableFuture.completedFuture(next());
        }

        @Override
        public CompletableFuture<Optional<Version>> tryLock() {
            return CompletableFuture.completedFuture(lock.tryLock() ? Optional.of(next()) : Optional.empty());
        }

        @Override
        public CompletableFuture<Optional<Version>> tryLock(Duration timeout) {
            try {
                boolean got = lock.tryLock(timeout.toMillis(), TimeUnit.MILLISECONDS);
                return CompletableFuture.completedFuture(got ? Optional.of(next()) : Optional.empty());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return CompletableFuture.completedFuture(Optional.empty());
            }
        }

        @Override
        public CompletableFuture<Void> unlock() {
            lock.unlock();
            return CompletableFuture.completedFuture(null);
        }
    }

    @Override
    @SuppressWarnings("unchecked")
    public synchronized <K, V> ConsistentMapBuilder<K, V> consistentMapBuilder() {
        return new TestConsistentMap.Builder<K, V>() {
            @Override
            public ConsistentMap<K, V> build() {
                synchronized (TestStorage.this) {
                    return (ConsistentMap<K, V>) maps.computeIfAbsent(name(),
                            n -> new Atomic<>((ConsistentMap<K, V>) super.build(), serializer()));
                }
            }
        };
    }

    /** Linearizable, serializing: see the class comment. */
    private static final class Atomic<K, V> extends ConsistentMapAdapter<K, V> {
        private final ConsistentMap<K, V> map;
        private final Serializer serializer;

        Atomic(ConsistentMap<K, V> map, Serializer serializer) {
            this.map = map;
            this.serializer = serializer;
        }

        private V copy(V value) {
            return serializer.decode(serializer.encode(value));
        }

        @Override
        public String name() {
            return map.name();
        }

        @Override
        public synchronized int size() {
            return map.size();
        }

        @Override
        public synchronized boolean isEmpty() {
            return map.isEmpty();
        }

        @Override
        public synchronized Versioned<V> get(K key) {
            return map.get(key);
        }

        @Override
        public synchronized Versioned<V> put(K key, V value) {
            return map.put(key, copy(value));
        }

        @Override
        public synchronized Versioned<V> putIfAbsent(K key, V value) {
            return map.putIfAbsent(key, copy(value));
        }

        @Override
        public synchronized boolean replace(K key, long version, V value) {
            return map.replace(key, version, copy(value));
        }

        @Override
        public synchronized boolean remove(K key, long version) {
            return map.remove(key, version);
        }

        @Override
        public synchronized Versioned<V> remove(K key) {
            return map.remove(key);
        }

        @Override
        public synchronized void clear() {
            map.clear();
        }

        @Override
        public synchronized Set<K> keySet() {
            return Set.copyOf(map.keySet());
        }

        @Override
        public synchronized Collection<Versioned<V>> values() {
            return List.copyOf(map.values());
        }

        @Override
        public synchronized Set<Map.Entry<K, Versioned<V>>> entrySet() {
            return map.entrySet().stream().map(e -> Map.entry(e.getKey(), e.getValue())).collect(Collectors.toSet());
        }
    }
}
