print('Now run this command:')
print()
print('echo', 12 * 21, '> answer.txt')
