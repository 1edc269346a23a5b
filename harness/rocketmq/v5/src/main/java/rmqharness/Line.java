package rmqharness;

import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.broker.transaction.queue.DefaultTransactionalMessageCheckListener;
import org.apache.rocketmq.broker.transaction.queue.MessageQueueOpContext;
import org.apache.rocketmq.broker.transaction.queue.TransactionalMessageServiceImpl;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageExtBrokerInner;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.remoting.protocol.RequestCode;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/** The RocketMQ 5.x line of the harness (5.3.3): what it does differently from 4.9. */
final class Line implements BrokerLine {
  /** The broker-side message; 5.x keeps it in rocketmq-common. */
  static final class BrokerMessage extends MessageExtBrokerInner {}

  /** The request codes (END_TRANSACTION); 5.x keeps it in rocketmq-remoting. */
  static final class RequestCodes extends RequestCode {}

  @Override
  public void configureNameServer(NettyServerConfig nameServer) {
    nameServer.setBindAddress("127.0.0.1");
  }

  @Override
  public void configureBroker(
      BrokerConfig broker, MessageStoreConfig store, NettyServerConfig server, long opBatchIntervalMs) {
    broker.setTransactionOpBatchInterval((int) opBatchIntervalMs);
    store.setTimerWheelEnable(false);
    server.setBindAddress("127.0.0.1");
  }

  @Override
  public void initCheckListener(DefaultTransactionalMessageCheckListener listener) {
    listener.initExecutorService();
  }

  @Override
  public boolean opsBuffered(BrokerController broker) {
    TransactionalMessageServiceImpl tms = (TransactionalMessageServiceImpl) broker.getTransactionalMessageService();
    for (MessageQueueOpContext c : tms.getDeleteContext().values()) {
      if (!c.getContextQueue().isEmpty()) return true;
    }
    return false;
  }

  @Override
  public long queueOffset(GetMessageResult result, int i, MessageExt decoded) {
    // A 5.x read reports each message's queue offset beside its buffer.
    return result.getMessageQueueOffset().get(i);
  }
}
