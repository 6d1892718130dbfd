package org.innetagg.onos.web;

import org.onlab.rest.AbstractWebApplication;

import java.util.Set;

/** The app's web context, /onos/innet-agg (pom.xml web.context). */
public class AggregationWebApplication extends AbstractWebApplication {
    @Override
    public Set<Class<?>> getClasses() {
        return getClasses(AggregationWebResource.class, TrafficClassWebResource.class, OwnerWebResource.class);
    }
}
