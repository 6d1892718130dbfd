package org.innetagg.onos.aggregation;

/**
 * A placement document the app cannot apply. The message is {@code "<field>: <reason>"};
 * the status is the HTTP answer (400 for the document, 503 for a device that does not answer).
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
