package org.innetagg.onos.aggregation;

import java.util.List;
import java.util.Objects;

/** One aggregator of a placement document: {@code jobs[0].aggregators[index]}. */
public final class AggregatorConfig {
    public final int index;
    public final String switchId;
    public final List<String> children;
    public final int fanIn;
    public final String nextHop;
    public final long poolBase;
    public final int poolSize;

    public AggregatorConfig(int index, String switchId, List<String> children, int fanIn, String nextHop,
                            long poolBase, int poolSize) {
        this.index = index;
        this.switchId = switchId;
        this.children = List.copyOf(children);
        this.fanIn = fanIn;
        this.nextHop = nextHop;
        this.poolBase = poolBase;
        this.poolSize = poolSize;
    }

    /** The document path of one of this aggregator's fields, for error messages. */
    public String field(String name) {
        return "jobs[0].aggregators[" + index + "]." + name;
    }

    boolean overlaps(AggregatorConfig other) {
        return poolBase < other.poolBase + other.poolSize && other.poolBase < poolBase + poolSize;
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof AggregatorConfig)) {
            return false;
        }
        AggregatorConfig a = (AggregatorConfig) o;
        return index == a.index && fanIn == a.fanIn && poolBase == a.poolBase && poolSize == a.poolSize
                && switchId.equals(a.switchId) && children.equals(a.children) && nextHop.equals(a.nextHop);
    }

    @Override
    public int hashCode() {
        return Objects.hash(index, switchId, children, fanIn, nextHop, poolBase, poolSize);
    }
}
