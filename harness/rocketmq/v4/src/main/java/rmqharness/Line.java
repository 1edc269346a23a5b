package rmqharness;

import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.broker.transaction.queue.DefaultTransactionalMessageCheckListener;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.protocol.RequestCode;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * The RocketMQ 4.9 line of the harness (4.9.7): no op batches (one op message per end, written at
 * once), no timer wheel, no bind address (4.9's servers listen on all interfaces; the broker
 * advertises 127.0.0.1), and a check listener that needs no set-up.
 */
final class Line implements BrokerLine {
  /** The broker-side message; 4.9 keeps it in rocketmq-store. */
  static final class BrokerMessage extends MessageExtBrokerInner {}

  /** The request codes (END_TRANSACTION); 4.9 keeps it in rocketmq-common's protocol package. */
  static final class RequestCodes extends RequestCode {}

  @Override
  public void configureNameServer(NettyServerConfig nameServer) {}

  @Override
  public void configureBroker(
      BrokerConfig broker, MessageStoreConfig store, NettyServerConfig server, long opBatchIntervalMs) {}

  @Override
  public void initCheckListener(DefaultTransactionalMessageCheckListener listener) {}

  @Override
  public boolean opsBuffered(BrokerController broker) {
    return false;
  }

  @Override
  public long queueOffset(GetMessageResult result, int i, MessageExt decoded) {
    // A 4.9 read reports no offsets beside its buffers: the commit-log record carries its queue offset.
    return decoded.getQueueOffset();
  }
}
