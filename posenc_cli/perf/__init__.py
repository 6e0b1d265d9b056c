"""Speed: `posenc bench`, sweep profiles and the cost model behind them."""
