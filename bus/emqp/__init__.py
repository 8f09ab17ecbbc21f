"""eMQP: a job broker for EventMQ workers and clients (``twistd -n emqp``), with the Twisted
worker and client libraries that speak to it."""
