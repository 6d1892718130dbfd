package org.innetagg.onos.aggregation;

/**
 * A document the app cannot apply (an aggregation placement or a traffic class). The message
 * is {@code "<field>: <reason>"}; the status is the HTTP answer (400 for the document, 503 for
 * a device that does not answer or no free job number).
 */
public class InvalidPlacementException extends Exception {
    private static final long serialVersionUID = 1L;

    private final int status;

    public InvalidPlacementException(String field, String reason) {
        this(400, field, reason);
    }

    public InvalidPlacementException(int status, String field, String reason) {
        super(field + ": " + reason);
        this.status = status;
    }

    public int status() {
        return status;
    }
}
